"""What framefleet's command-line programs share (the scripts in scripts/ are thin wrappers over the package)."""

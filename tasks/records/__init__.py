"""A run's records on disk: the manifest and its lineage, the per-video outcomes and the quarantine."""

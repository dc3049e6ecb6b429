"""The run's report: its HTML page, the quality section and the per-gate table."""

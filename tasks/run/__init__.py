"""The run of a dataset: enqueue and chains, the count of finished videos, the statistics and the run summary.

Also a run's record, its cancellation, per-video metadata, the quarantine and the report.
"""

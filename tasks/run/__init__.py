"""The run of a dataset: enqueue and chains, sending, the count of finished videos and the run's end.

Also a run's record in Redis, its cancellation, per-video metadata and the sweep that resends lost work.
A run's files are kept by ``tasks.records``, its statistics by ``tasks.statistics`` and its report by
``tasks.report``.
"""

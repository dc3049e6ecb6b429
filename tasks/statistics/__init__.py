"""The dataset's statistics as values that add: per-video moments, their sums in Redis, the partials and the file."""

"""Watching a run: Prometheus metrics, progress counters, Flower's view and guard, `inspect gpu`, stall reasons."""

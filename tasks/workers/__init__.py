"""A worker process: its start-up (GPU pinning, model preload), its heartbeat thread and its registry entry."""

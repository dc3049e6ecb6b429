"""One Redis client per process for framefleet's own keys (registry, progress, routing)."""

from __future__ import annotations

import os

import redis

_clients: dict[tuple[int, str], redis.Redis] = {}


def get_redis(url: str) -> redis.Redis:
    """Return a client for ``url`` shared within this process (a fresh one after fork)."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        client = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=5,
            socket_connect_timeout=5,
            health_check_interval=10,
        )
        _clients[key] = client
    return client

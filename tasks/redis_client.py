"""One Redis client per process for framefleet's own keys (registry, progress, routing)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (another process may take it before use)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_argv(port: int, folder: str | Path, persistent: bool = False, config: str | Path | None = None) -> list[str]:
    """The command line of a private redis-server on 127.0.0.1:``port`` keeping its files in ``folder``.

    ``persistent``: an append-only file written at every command (survives a restart), else nothing on disk.
    ``config``: a configuration file read first (the password, kept off the command line).
    """
    return [
        "redis-server",
        *([str(config)] if config else []),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(folder),
        "--save",
        "",
        *(["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]),
    ]


# Set KEYS[1] to ARGV[1] for ARGV[2] ms when it holds ARGV[1] or nothing (Redis restarted, or was away past
# the TTL); return 1, else 0. A compare-and-set: a holder never takes over a key another holds (claims, leases).
SET_IF_OURS_OR_MISSING = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

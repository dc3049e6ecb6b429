"""One live worker per node name: a second ``celery worker`` named as a live one is refused at start.

Two workers of one name would be one worker to the registry, the leases and Flower: each one's heartbeat
overwrites the other's state, and a lease held by one is taken for the other's.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import redis

from tasks import keys


class NodeNameTaken(SystemExit):
    """A live worker already has this node name; the message names it and the ``-n`` that gives another."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (one of another user's counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder(state: dict[str, Any] | None, now: float, ttl_s: float) -> str | None:
    """Why the worker of published ``state`` is live (its process on this host, or a fresh state from another
    host), or None when it is gone or is this process."""
    if not state or state.get("pid") == os.getpid():
        return None
    pid = int(state.get("pid") or 0)
    if state.get("host") == socket.gethostname():
        return f"pid {pid} on this host" if pid_alive(pid) else None
    updated = float(state.get("updated") or 0)
    if state.get("host") and now - updated < ttl_s:
        return f"pid {pid} on host {state['host']}, heard from {now - updated:.0f} s ago"
    return None  # an earlier version's state (no host) or a stale one: its worker is gone


def refuse_if_taken(r: redis.Redis, hostname: str, queues: list[str], ttl_s: float, now: float) -> None:
    """Raise NodeNameTaken when a live worker is named ``hostname`` already; a Redis that does not answer is
    left to the checks that need it."""
    try:
        raw = r.get(keys.WORKER_PREFIX + hostname)
    except redis.RedisError:
        return
    why = holder(json.loads(raw) if raw else None, now, ttl_s)
    if why is None:
        return
    name, _, host = hostname.partition("@")
    queue = ",".join(queues)
    raise NodeNameTaken(
        f"framefleet: a live worker is named {hostname} already ({why}); a second worker of that name would be "
        f"taken for it (its state, its leases). Give this one a name of its own with -n: "
        f"`celery -A tasks worker -Q {queue} -n {name}-2@{'%h' if host == socket.gethostname() else host}`"
    )

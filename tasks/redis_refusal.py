"""Redis refusing writes while it answers: full (``maxmemory`` reached under ``noeviction``), a read-only
replica (``READONLY``), or a failed snapshot that stops writes (``MISCONF``). Each is named with its fix,
for the enqueuer's clear stop and the workers' log lines, instead of a traceback."""

from __future__ import annotations

import redis
from redis.exceptions import OutOfMemoryError, ReadOnlyError  # type: ignore[attr-defined]  # stubs predate them

from tasks import keys

# The exit status of a command that stopped because Redis refused its writes (tasks.cli.common lists them all).
EXIT_STATUS = 5

FULL = (
    "Redis is full: it refuses writes past its maxmemory (policy noeviction, which framefleet needs: an "
    "evicted key is a lost task). Give it room: raise maxmemory (`redis-cli CONFIG SET maxmemory 8gb`, and "
    "in redis.conf), or free memory (`redis-cli --bigkeys` shows what holds it)"
)
READ_ONLY = (
    "Redis is read-only: REDIS_URL points at a replica, or the primary was demoted. Point REDIS_URL at the "
    "primary (`redis-cli INFO replication` there says role:master)"
)
MISCONF = (
    "Redis stopped accepting writes because it could not save its snapshot (MISCONF): see its log, free "
    "the disk of its `dir` or fix its permissions, or `redis-cli CONFIG SET stop-writes-on-bgsave-error no`"
)


def refusal(exc: BaseException) -> str | None:
    """Why Redis refused a write and the fix, when ``exc`` (or an error it was raised from) is such a refusal;
    None for any other error (not answering, a wrong password, a bug)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if isinstance(current, OutOfMemoryError) or text.startswith("OOM ") or "used memory > 'maxmemory'" in text:
            return f"{FULL} ({text})"
        if isinstance(current, ReadOnlyError) or text.startswith("READONLY") or "against a read only replica" in text:
            return f"{READ_ONLY} ({text})"
        if text.startswith("MISCONF") or "MISCONF " in text:
            return f"{MISCONF} ({text.splitlines()[0][:200]})"
        current = current.__cause__ or current.__context__
    return None


def write_refused(client: redis.Redis) -> str | None:
    """Why Redis at ``client`` refuses a write now (``refusal``), by writing a key that expires in a second;
    None when it takes the write or does not answer (that is another error, reported where it happens)."""
    try:
        client.set(keys.WRITE_PROBE, "1", px=1000)
    except redis.RedisError as exc:
        return refusal(exc)
    return None

"""Claims: at most one live run of a video's stage at a time, and no second completion of a task.

A task redelivered while its first delivery still runs (past the visibility timeout), or the
same dataset enqueued twice, would otherwise run a stage twice at once and continue the chain
twice. A claim is a Redis key per (output root, video, stage) held with a TTL that the
worker's heartbeat renews; a finished task id is remembered so a late duplicate is dropped.
"""

from __future__ import annotations

import hashlib

import redis

from tasks.errors import ClaimLost, ClaimUnconfirmed

CLAIM_PREFIX = "ff:claim:"
DONE_PREFIX = "ff:done:"

# claim key → owner value, for the heartbeat to renew
HELD: dict[str, str] = {}

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def claim_key(output_root: str, video_id: str, stage: str) -> str:
    root = hashlib.sha256(output_root.encode()).hexdigest()[:12]
    return f"{CLAIM_PREFIX}{root}:{video_id}:{stage}"


def acquire(r: redis.Redis, key: str, owner: str, ttl_s: float) -> str | None:
    """Take the claim; return None when taken, else the current holder's value."""
    if r.set(key, owner, nx=True, px=int(ttl_s * 1000)):
        HELD[key] = owner
        return None
    holder = r.get(key)
    if holder == owner:  # our own claim, e.g. after a retry of this very task
        HELD[key] = owner
        return None
    return holder or ""


def confirm(r: redis.Redis, key: str, ttl_s: float) -> None:
    """Check, just before publishing an output, that this process still holds ``key``; re-take it if it lapsed
    and nobody took it since. Raises ClaimLost when another run holds it, ClaimUnconfirmed when Redis cannot say.

    This is the fence of a host that was cut off or paused: its claim lapsed, another host took the stage over,
    and the late run must not overwrite that host's output or continue the chain a second time.
    """
    owner = HELD.get(key)
    if owner is None:
        return  # no claim taken (no Redis at start): nothing to fence with
    try:
        holder = r.get(key)
        if holder is None and r.set(key, owner, nx=True, px=int(ttl_s * 1000)):
            return  # lapsed (not renewed in time) but free: ours again
        holder = holder if holder is not None else r.get(key)
    except redis.RedisError as exc:
        raise ClaimUnconfirmed(f"cannot confirm the claim {key} before publishing ({exc}); output discarded, "
                               "the stage will run again", 10.0) from exc
    if holder != owner:
        HELD.pop(key, None)
        raise ClaimLost(f"{key} is now held by {holder or 'nobody'} (ours lapsed: this host was cut off from Redis "
                        "or paused for longer than lease_ttl_s); output discarded")


def release(r: redis.Redis, key: str) -> None:
    owner = HELD.pop(key, None)
    if owner is not None:
        r.eval(_RELEASE, 1, key, owner)


def renew(r: redis.Redis, ttl_s: float) -> None:
    pipe = r.pipeline()
    for key in HELD:
        pipe.pexpire(key, int(ttl_s * 1000))
    pipe.execute()


def mark_done(r: redis.Redis, task_id: str, ttl_s: int) -> None:
    r.set(DONE_PREFIX + task_id, "1", ex=ttl_s)


def is_done(r: redis.Redis, task_id: str) -> bool:
    return bool(r.exists(DONE_PREFIX + task_id))

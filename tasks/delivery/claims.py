"""Claims: at most one live run of a video's stage at a time, and no second completion of a task.

A task redelivered while its first delivery still runs (past the visibility timeout), or the
same dataset enqueued twice, would otherwise run a stage twice at once and continue the chain
twice. A claim is a Redis key per (output root, video, stage) held with a TTL that the
worker's heartbeat re-asserts; a finished task id is remembered in its run's done marks (an
8-byte integer in one of the run's small sets, tasks.delivery.marks) so a late duplicate is
dropped, and once the run has ended (tasks.run.completion.retire) every task of it is: the done
marks then go, and the run's end mark stands for them.

The task thread takes claims and the heartbeat thread renews them, so the held set is read
under a lock. A task is marked done only after Celery has sent its continuation (the
``task_postrun`` of a success), and its claim is released after that, never before: a
duplicate arriving in between sees the claim or the done mark, never neither.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import redis

from tasks import keys
from tasks.delivery import marks
from tasks.delivery.marks import Marks
from tasks.errors import ClaimLost, ClaimUnconfirmed
from tasks.redis_client import SET_IF_OURS_OR_MISSING
from tasks.workers import registry

log = logging.getLogger("framefleet.claims")
CLAIM_PREFIX = keys.CLAIM_PREFIX
MARKS_MARGIN_S = 24 * 3600  # a redelivered message's wait in a long queue, past the visibility timeout

# claim key → owner value, for the heartbeat to renew; task id → (its claim key, where it is marked done), to
# finish at postrun
HELD: dict[str, str] = {}
PENDING: dict[str, tuple[str, Marks]] = {}
_lock = threading.Lock()

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# Re-assert: set it when it is ours or missing (tasks.redis_client.SET_IF_OURS_OR_MISSING).
_REASSERT = SET_IF_OURS_OR_MISSING
# The start of a delivery in one round trip: a cancelled run (KEYS[1], optional), a finished task
# (its mark ARGV[3] in its shard of the run's done marks, KEYS[2]) or an ended run (KEYS[4], the run's hash), else
# the claim (KEYS[3]) taken, or its holder's value. Atomic, so the holder read after a refused SET NX
# cannot have lapsed in between. A delivery that gets the claim (or holds it already) has its start
# counted in the same step when ARGV[5] (the count's TTL) is set: field ARGV[4] (the task id) of KEYS[5].
_BEGIN = """
if KEYS[1] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then return {'cancelled', ''} end
if redis.call('SISMEMBER', KEYS[2], ARGV[3]) == 1 then return {'done', ''} end
if redis.call('HEXISTS', KEYS[4], 'ended') == 1 then return {'ended', ''} end
local function counted(status, holder)
  if ARGV[5] == '' then return {status, holder} end
  local starts = redis.call('HINCRBY', KEYS[5], ARGV[4], 1)
  redis.call('EXPIRE', KEYS[5], ARGV[5])
  return {status, holder, starts}
end
if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then return counted('claimed', '') end
local holder = redis.call('GET', KEYS[3]) or ''
if holder == ARGV[1] then return counted('held', holder) end
return {'held', holder}
"""
# Take a claim over from a holder proven gone, only if it is still that holder's.
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class Verdict:
    """What a delivery should do: run the stage, drop itself as a duplicate, wait for the holder, or stop
    (its run was cancelled)."""

    action: Literal["run", "drop", "wait", "cancelled"]
    holder: str = ""
    why: str = ""
    starts: int | None = None  # the task's starts, this one included, when ``decide`` counted it


def claim_key(output_root: str, video_id: str, stage: str) -> str:
    root = hashlib.sha256(output_root.encode()).hexdigest()[:12]
    return f"{CLAIM_PREFIX}{root}:{video_id}:{stage}"


def owner_value(hostname: str, task_id: str) -> str:
    return f"{hostname} {task_id}"


def acquire(r: redis.Redis, key: str, owner: str, ttl_s: float) -> str | None:
    """Take the claim; return None when taken, else the current holder's value."""
    if r.set(key, owner, nx=True, px=int(ttl_s * 1000)):
        _hold(key, owner)
        return None
    holder = r.get(key)
    if holder is None and reassert(r, key, owner, ttl_s):  # lapsed in between
        _hold(key, owner)
        return None
    if holder == owner:  # our own claim, e.g. after a retry of this very task
        _hold(key, owner)
        return None
    return holder or ""


def _hold(key: str, owner: str) -> None:
    with _lock:
        HELD[key] = owner


def reassert(r: redis.Redis, key: str, owner: str, ttl_s: float) -> bool:
    return bool(r.eval(_REASSERT, 1, key, owner, int(ttl_s * 1000)))


def holder_running(r: redis.Redis, hostname: str, task_id: str) -> bool:
    """True when worker ``hostname`` is registered and its published state shows it running ``task_id``."""
    raw = r.get(registry.WORKER_PREFIX + hostname)
    if not raw:
        return False
    current = json.loads(raw).get("current") or {}
    return current.get("task_id") == task_id


def decide(
    r: redis.Redis,
    key: str,
    task_id: str,
    hostname: str,
    ttl_s: float,
    cancel_key: str | None = None,
    run_id: str = "",
    count_ttl_s: int | None = None,
) -> Verdict:
    """Claim ``key`` for this delivery of ``task_id`` of run ``run_id``, or say why it must drop itself, wait, or stop.

    A delivery is dropped only when its task is done, its run has ended, or its holder is provably
    alive and running that very task; a holder that died hands its claim over at once. With
    ``cancel_key`` (the run's cancel flag) set in Redis, the verdict is "cancelled" and nothing is
    claimed. The common case, a free claim, is one round trip (two for a process's first task of a run:
    its shard count). With ``count_ttl_s``, a "run" verdict of that round trip also counts the task's
    start in the run's start counts (tasks.delivery.marks; kept ``count_ttl_s`` past the last write) and
    carries the count in ``starts``. Raises redis.RedisError when Redis cannot be asked.
    """
    owner = owner_value(hostname, task_id)
    done, run = marks.where(r, run_id, task_id), keys.RUN_PREFIX + run_id
    status, holder, *starts = r.eval(
        _BEGIN,
        5,
        cancel_key or "",
        done.done_key,
        key,
        run,
        done.attempts_key,
        owner,
        int(ttl_s * 1000),
        done.mark,
        task_id,
        "" if count_ttl_s is None else count_ttl_s,
    )
    if status == "cancelled":
        return Verdict("cancelled", why="its run was cancelled")
    if status == "done":
        return Verdict("drop", why="it has finished")
    if status == "ended":
        return Verdict("drop", why=f"its run {run_id} has ended")
    if status == "claimed" or holder == owner:  # free, or our own claim (e.g. after a retry of this very task)
        _hold(key, owner)
        _remember(task_id, key, done)
        return Verdict("run", starts=int(starts[0]) if starts else None)
    holder_host, _, holder_task = holder.partition(" ")
    if holder_task != task_id:
        return Verdict("wait", holder, "another run of this stage holds the claim")
    if holder_running(r, holder_host, task_id):
        return Verdict("drop", holder, f"it runs on {holder_host}")
    if r.eval(_TAKE_OVER, 1, key, holder, owner, int(ttl_s * 1000)):
        log.warning("took over the claim of task %s from %s, which no longer runs it", task_id, holder_host)
        _hold(key, owner)
        _remember(task_id, key, done)
        return Verdict("run", holder)
    return Verdict("wait", r.get(key) or "", "the claim changed hands")


def _remember(task_id: str, key: str, done: Marks) -> None:
    with _lock:
        PENDING[task_id] = (key, done)


def finish(
    r: redis.Redis, task_id: str, succeeded: bool, done_ttl_s: int, before: Callable[[Any], None] | None = None
) -> None:
    """Mark ``task_id`` done when it succeeded (its start count then goes), then release its claim; never raises.

    Called after Celery has sent the task's continuation, so a duplicate delivery is dropped
    only once the chain has moved on. ``before`` queues the task's other end-of-task writes on
    the same pipeline (one round trip for all). A task that took no claim (not a stage task) has
    no done mark: nothing asks for one.
    """
    with _lock:
        key, done = PENDING.pop(task_id, (None, None))
        owner = HELD.pop(key, None) if key is not None else None
    # One round trip; Redis runs a pipeline's commands in order, so the done mark is set before the
    # claim goes (if the connection breaks between them, the claim's TTL ends it).
    pipe = r.pipeline(transaction=False)
    if before is not None:
        before(pipe)
    if succeeded and done is not None:
        _queue_done(pipe, task_id, done, done_ttl_s)
    if owner is not None:
        pipe.eval(_RELEASE, 1, key, owner)
    if not len(pipe):
        return
    try:
        pipe.execute()
    except redis.RedisError as exc:  # the claim's TTL ends it; a duplicate then finds the output made
        log.warning("end of task %s not recorded, its claim not released: %s", task_id, exc)


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
        raise ClaimUnconfirmed(
            f"cannot confirm the claim {key} before publishing ({exc}); output discarded",
            10.0,
        ) from exc
    if holder != owner:
        with _lock:
            HELD.pop(key, None)
        raise ClaimLost(
            f"{key} is now held by {holder or 'nobody'} (ours lapsed: this host was cut off from Redis "
            "or paused for longer than lease_ttl_s); output discarded"
        )


def renew(r: redis.Redis, ttl_s: float) -> list[str]:
    """Re-assert every held claim; return the keys another worker holds now (this one lost them)."""
    with _lock:
        held = list(HELD.items())  # the task thread takes and releases claims meanwhile
    pipe = r.pipeline(transaction=False)
    for key, owner in held:
        pipe.eval(_REASSERT, 1, key, owner, int(ttl_s * 1000))
    lost = [key for (key, _), ok in zip(held, pipe.execute(), strict=True) if not ok]
    for key in lost:
        log.warning("claim %s is held by %s now, not by this worker", key, r.get(key))
    return lost


def marks_ttl_s(visibility_timeout_s: int) -> int:
    """How long a run's done marks and start counts live past its last write (s), when the run does not
    end (it was cancelled, or its callback never ran): past any redelivery of its messages.

    A second delivery exists only while the first is unacknowledged (kombu restores it after the
    visibility timeout, the reaper after a lost worker); the margin covers its wait in the queue.
    A run that ends deletes them at once (tasks.run.completion.retire): its end mark drops later ones.
    """
    return visibility_timeout_s + MARKS_MARGIN_S


def _queue_done(pipe: Any, task_id: str, done: Marks, ttl_s: int) -> None:
    """The done mark, then the end of the task's start count: a later delivery is dropped before it counts."""
    pipe.sadd(done.done_key, done.mark)
    pipe.expire(done.done_key, ttl_s)
    pipe.hdel(done.attempts_key, task_id)


def is_done(r: redis.Redis, run_id: str, task_id: str) -> bool:
    done = marks.where(r, run_id, task_id)
    return bool(r.sismember(done.done_key, done.mark))

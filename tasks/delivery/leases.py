"""Leases on in-flight messages: re-asserted by a live worker, and a reaper that requeues only orphans.

kombu's Redis transport keeps each delivered, unacknowledged message in the ``unacked`` hash
(and its delivery time in ``unacked_index``) until the ack. A worker holds a lease key per
message it holds; when a worker dies its leases lapse and the reaper puts those messages back
on their queue within about the lease TTL, instead of after the visibility timeout.

A lapsed lease alone proves nothing: Redis may have restarted (keys past their TTL are gone
when it loads its append-only file) or been away longer than the TTL. So a holder renews by
re-asserting (re-creating the key when it is missing, and the message's ``unacked`` entry
too), and the reaper requeues a message only when its owner is provably not holding it: the
owner's worker has been absent from the registry longer than the TTL, or is present and does
not list the message among those it holds. Nobody reaps while Redis itself is younger than a
TTL, so every live holder has had a heartbeat to re-assert first.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import celery
import redis

from tasks import keys
from tasks.delivery import requeues
from tasks.redis_client import SET_IF_OURS_OR_MISSING
from tasks.workers import registry

log = logging.getLogger("framefleet.leases")
LEASE_PREFIX = keys.LEASE_PREFIX
OWNER_PREFIX = keys.LEASE_OWNER_PREFIX  # per delivery tag: "hostname task_id", kept past a lapsed lease
OWNER_TTL_S = 3600  # a lost worker's record, for the reaper; a task that ends removes its own (``release``)
ORPHAN_PREFIX = keys.ORPHAN_PREFIX  # first time the reaper saw a message with no lease and no owner
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
REAPER_LOCK = keys.REAPER_LOCK

# Re-assert: set it when it is ours or missing (tasks.redis_client.SET_IF_OURS_OR_MISSING).
_REASSERT = SET_IF_OURS_OR_MISSING

# Take or extend the lease when it is free or ours, and record its owner; else return the holder.
_GRANT = """
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
return false
"""


@dataclass
class Held:
    """A message this process holds: its task id and its ``unacked`` entry as kombu wrote it."""

    task_id: str
    entry: str | None = None


# delivery tag → the messages this worker process holds (received, not yet finished)
HELD: dict[str, Held] = {}
# task id → tag, for deliveries whose tag another worker's lease holds; ids of those dropped
SHARED: dict[str, str] = {}
DROPPED: set[str] = set()
_lock = threading.Lock()


def owner_value(hostname: str, task_id: str) -> str:
    return f"{hostname} {task_id}"


def grant(r: redis.Redis, tag: str, task_id: str, hostname: str, ttl_s: float, entry: str | None = None) -> str | None:
    """Hold message ``tag``; return the owner of a lease already held by another worker, else None.

    kombu keeps a restored message's delivery tag, so a redelivery of a message whose first
    delivery still runs elsewhere arrives under the same tag; its lease is left to the holder.
    """
    owner = owner_value(hostname, task_id)
    with _lock:
        HELD[tag] = Held(task_id, entry)
    # One round trip (it runs as each message arrives, before its task starts); renewals take the
    # lease over only once the holder lets it lapse.
    current = r.eval(_GRANT, 2, LEASE_PREFIX + tag, OWNER_PREFIX + tag, owner, int(ttl_s * 1000), OWNER_TTL_S)
    return current or None


def reassert(r: redis.Redis, tag: str, owner: str, ttl_s: float) -> bool:
    """Re-create or extend the lease of ``tag`` if it is ``owner``'s or missing; False when another holds it."""
    if not r.eval(_REASSERT, 1, LEASE_PREFIX + tag, owner, int(ttl_s * 1000)):
        return False
    r.set(OWNER_PREFIX + tag, owner, ex=OWNER_TTL_S)
    return True


# KEYS: a message's lease and owner record; ARGV: this holder's value. Each goes only if it is ours.
_RELEASE = """
for i = 1, 2 do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 0
"""


def forget(task_id: str) -> list[str]:
    """This process no longer holds the message of ``task_id`` (the task ended; the ack follows); return
    the tags whose lease it held (not those of a duplicate delivery, whose lease is another's)."""
    with _lock:
        tags = [t for t, h in HELD.items() if h.task_id == task_id]
        for tag in tags:
            del HELD[tag]
        shared = SHARED.pop(task_id, None)
    return [t for t in tags if t != shared]


def release(pipe: Any, tags: list[str], hostname: str, task_id: str) -> None:
    """Queue on ``pipe`` the removal of the leases and owner records of ``tags`` that are still this task's.

    The ack follows at once; should the worker die before it, the message stays in ``unacked``
    without an owner, and the reaper requeues it after a TTL (its task's done mark then drops it).
    """
    owner = owner_value(hostname, task_id)
    for tag in tags:
        pipe.eval(_RELEASE, 2, LEASE_PREFIX + tag, OWNER_PREFIX + tag, owner)


def dropped_duplicate(task_id: str) -> None:
    """The delivery of ``task_id`` drops itself as a duplicate: its ack must leave a shared entry alone."""
    with _lock:
        if task_id in SHARED:
            DROPPED.add(task_id)


def guard_ack(request: Any) -> None:
    """Make the ack of ``request`` local only if its delivery is dropped as a duplicate of a live holder.

    kombu keeps a restored message's delivery tag, and its Redis ack deletes the ``unacked``
    entry by tag: acking the duplicate would delete the entry of the delivery still running
    elsewhere, which then could not be requeued if its worker died.
    """
    from kombu.transport.virtual import QoS

    message = request.message
    ack, reject = request._on_ack, request._on_reject

    def local_only() -> bool:
        with _lock:
            if request.id not in DROPPED:
                return False
            DROPPED.discard(request.id)
        QoS.ack(message.channel.qos, message.delivery_tag)  # the channel's bookkeeping, not Redis
        message._state = "ACK"
        log.info(
            "acknowledged duplicate delivery %s of task %s locally; its holder keeps the message",
            message.delivery_tag,
            request.id,
        )
        return True

    request._on_ack = lambda logger, errors: local_only() or ack(logger, errors)
    request._on_reject = lambda logger, errors, requeue=False: local_only() or reject(logger, errors, requeue)


def release_now(r: redis.Redis, tags: list[str], hostname: str, task_id: str) -> None:
    """Remove the leases of an ended task's ``tags`` from ``r`` at once; never raises (they lapse anyway)."""
    try:
        pipe = r.pipeline(transaction=False)
        release(pipe, tags, hostname, task_id)
        pipe.execute()
    except Exception as exc:
        log.warning("leases of task %s not released (%s); they lapse with their TTL", task_id, exc)


def held_tags() -> list[str]:
    with _lock:
        return list(HELD)


def renew(r: redis.Redis, hostname: str, ttl_s: float) -> int:
    """Re-assert every held lease (and a held message's ``unacked`` entry if it is gone); return how many."""
    with _lock:
        held = list(HELD.items())  # the task thread adds and removes entries meanwhile
    renewed = 0
    for tag, h in held:
        owner = owner_value(hostname, h.task_id)
        if not reassert(r, tag, owner, ttl_s):
            continue  # another worker holds this message's lease (a duplicate delivery of it)
        # Redis restarted without that entry, or a duplicate delivery's ack removed it (kombu reuses
        # the tag on restore): put it back so the message survives if this worker dies now. Under the
        # lock, so a task that has just ended (and whose ack may follow at once) is not brought back.
        with _lock:
            still_held = tag in HELD
            if still_held and h.entry is not None and r.hsetnx(UNACKED, tag, h.entry):
                r.zadd(UNACKED_INDEX, {tag: time.time()}, nx=True)
                log.warning("restored the unacked entry of message %s (task %s), held by this worker", tag, h.task_id)
        if not still_held:
            # The task ended since the snapshot, and its release may have run before the re-assert
            # above re-created the lease and owner record: remove them again (only if still ours).
            r.eval(_RELEASE, 2, LEASE_PREFIX + tag, OWNER_PREFIX + tag, owner)
            continue
        renewed += 1
    return renewed


def reap(app: celery.Celery, r: redis.Redis, workers_r: redis.Redis, ttl_s: float) -> list[str]:
    """Requeue every unacknowledged message older than ``ttl_s`` that no live worker holds; nothing until
    Redis has ``settled``."""
    if not r.set(REAPER_LOCK, "1", nx=True, px=int(ttl_s * 500)):
        return []
    if not settled(r, workers_r, ttl_s):
        return []
    # kombu dates a delivery by the receiving host's clock, which may be off: a message whose lease
    # was granted (it has an owner record) is looked at whatever its age; only one never leased (its
    # worker died between delivery and the grant) waits until it looks older than the TTL.
    cutoff = time.time() - ttl_s
    delivered = r.zrange(UNACKED_INDEX, 0, -1, withscores=True)
    pipe = r.pipeline()
    for tag, _ in delivered:
        pipe.exists(OWNER_PREFIX + tag)
    candidates = [tag for (tag, at), owned in zip(delivered, pipe.execute(), strict=True) if owned or at <= cutoff]
    if not candidates:
        return []
    pipe = r.pipeline()
    for tag in candidates:
        pipe.exists(LEASE_PREFIX + tag)
    lapsed = [tag for tag, leased in zip(candidates, pipe.execute(), strict=True) if not leased]
    if not lapsed:
        return []
    workers = {w["hostname"]: w for w in registry.live_workers(workers_r)}
    orphans = [tag for tag in lapsed if _orphaned(r, workers_r, tag, workers, ttl_s)]
    if orphans:
        with app.connection_for_write() as conn:
            qos = conn.default_channel.qos
            for tag in orphans:
                requeues.note(r, tag, "its worker was lost (its lease lapsed)")
                qos.restore_by_tag(tag, leftmost=False)  # front: it was already under way
                r.delete(OWNER_PREFIX + tag, ORPHAN_PREFIX + tag)
    return orphans


def _orphaned(r: redis.Redis, workers_r: redis.Redis, tag: str, workers: dict[str, Any], ttl_s: float) -> bool:
    """True when no live worker can be holding message ``tag`` (its lease has lapsed)."""
    owner = r.get(OWNER_PREFIX + tag)
    if owner is None:
        # No record of who took it (its worker died before the lease was written): requeue once
        # it has stayed unowned a whole TTL, time enough for a live holder to re-assert.
        now = registry.redis_now(r)  # reapers on several hosts: one clock
        first = r.set(ORPHAN_PREFIX + tag, str(now), nx=True, px=int(ttl_s * 4000))
        since = now if first else float(r.get(ORPHAN_PREFIX + tag) or now)
        if now - since > ttl_s:
            log.warning("requeued message %s: no worker has held it for %.0f s", tag, now - since)
            return True
        return False
    hostname, _, task_id = owner.partition(" ")
    state = workers.get(hostname)
    if state is not None:
        if tag in state.get("leases", []):
            return False  # alive and holding it: its next heartbeat re-asserts the lease
        if time.time() - float(state.get("updated", 0)) < ttl_s and state.get("leases") is not None:
            log.warning(
                "requeued message %s (task %s): its worker %s is alive but no longer holds it", tag, task_id, hostname
            )
            return True
        return False
    absent_s = registry.absent_for_s(workers_r, hostname)
    if absent_s > ttl_s:
        log.warning(
            "requeued message %s (task %s): its worker %s has been gone %.0f s (worker lost)",
            tag,
            task_id,
            hostname,
            absent_s,
        )
        return True
    return False


def settled(r: redis.Redis, workers_r: redis.Redis, ttl_s: float) -> bool:
    """True once both Redis servers have been up for ``ttl_s``: the reaper's gate (``reap`` does nothing before).

    A restarted Redis has lost the leases of live holders (or let them lapse while it was down);
    after a whole TTL every live holder has had a heartbeat to re-assert them, so a lease still
    missing then is an orphan's.
    """
    return redis_uptime_s(r) >= ttl_s and redis_uptime_s(workers_r) >= ttl_s


def redis_uptime_s(r: redis.Redis) -> float:
    """Seconds since this Redis server started."""
    return float(r.info("server")["uptime_in_seconds"])


def on_task_received(request: Any, hostname: str, r: redis.Redis, ttl_s: float) -> None:
    """Lease the message of ``request``; a delivery under a tag another worker holds guards its ack."""
    message = getattr(request, "message", None)
    tag = getattr(message, "delivery_tag", None)
    if tag is None:
        return
    entry = unacked_entry(message)  # the message as JSON, a few KB: encoded once
    with _lock:
        HELD[str(tag)] = Held(request.id, entry)  # renewed even if Redis is away now
    other = grant(r, str(tag), request.id, hostname, ttl_s, entry)
    if other is not None:
        with _lock:
            SHARED[request.id] = str(tag)
        guard_ack(request)
    let_go_at_ack(request, r, hostname)


def let_go_at_ack(request: Any, r: redis.Redis, hostname: str) -> None:
    """Forget the message of ``request`` (and release its lease) just before this process acknowledges it.

    A solo worker's ``task_postrun`` (tasks.workers.worker.on_task_end) has done so already, and this finds
    nothing. A prefork pool's parent receives and acknowledges the message while the task runs in a child,
    where ``task_postrun`` fires and finds nothing held: without this the parent's heartbeat would renew the
    lease for good and put the acknowledged ``unacked`` entry back (``renew``), and a reaper would redeliver
    the message once the worker stopped.
    """
    ack, reject = request._on_ack, request._on_reject

    def let_go() -> None:
        tags = forget(request.id)
        if tags:
            release_now(r, tags, hostname, request.id)

    def on_ack(logger: Any, errors: Any) -> Any:
        let_go()
        return ack(logger, errors)

    def on_reject(logger: Any, errors: Any, requeue: bool = False) -> Any:
        let_go()
        return reject(logger, errors, requeue)

    request._on_ack, request._on_reject = on_ack, on_reject


def unacked_entry(message: Any) -> str | None:
    """The ``unacked`` hash value kombu's Redis transport stores for ``message`` (payload, exchange, key)."""
    raw = getattr(message, "_raw", None)
    info = getattr(message, "delivery_info", None) or {}
    if not isinstance(raw, dict) or "exchange" not in info:
        return None
    return json.dumps([raw, info["exchange"], info.get("routing_key")])

"""Leases on in-flight messages: renewed by a live worker, and a reaper that requeues lapsed ones.

kombu's Redis transport keeps each delivered, unacknowledged message in the ``unacked`` hash
(and its delivery time in ``unacked_index``) until the ack. A worker holds a lease key per
message; when a worker dies its leases lapse and the reaper puts those messages back on their
queue within about the lease TTL, instead of after the visibility timeout.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import celery
import redis

log = logging.getLogger("framefleet.leases")
LEASE_PREFIX = "ff:lease:"
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
REAPER_LOCK = "ff:reaper-lock"
# delivery tags that were ever leased: when such a lease is gone, the worker is gone, whatever the clocks say
LEASED = "ff:leased"

# delivery tag → task id of the messages this worker process holds
HELD: dict[str, str] = {}


def grant(r: redis.Redis, tag: str, task_id: str, hostname: str, ttl_s: float) -> None:
    HELD[tag] = task_id
    pipe = r.pipeline()
    pipe.set(LEASE_PREFIX + tag, f"{hostname} {task_id}", px=int(ttl_s * 1000))
    pipe.sadd(LEASED, tag)
    pipe.execute()


def renew(r: redis.Redis, ttl_s: float) -> int:
    """Renew the leases of the messages still unacknowledged; forget acknowledged ones."""
    tags = list(HELD)
    if not tags:
        return 0
    pipe = r.pipeline()
    for tag in tags:
        pipe.hexists(UNACKED, tag)
    alive = pipe.execute()
    pipe = r.pipeline()
    for tag, unacked in zip(tags, alive, strict=True):
        if unacked:
            pipe.pexpire(LEASE_PREFIX + tag, int(ttl_s * 1000))
        else:
            HELD.pop(tag, None)
    pipe.execute()
    return sum(alive)


def reap(app: celery.Celery, r: redis.Redis, ttl_s: float) -> list[str]:
    """Requeue every unacknowledged message older than ``ttl_s`` whose lease has lapsed."""
    if not r.set(REAPER_LOCK, "1", nx=True, px=int(ttl_s * 500)):
        return []
    # kombu dates each delivery by the receiving host's clock, so on several hosts an age says little: a
    # message whose lease existed and lapsed is reaped at once; only one never leased (its worker died
    # between delivery and the grant) waits until it looks older than the TTL.
    cutoff = time.time() - ttl_s
    delivered = dict(r.zrange(UNACKED_INDEX, 0, -1, withscores=True))
    leased = r.smembers(LEASED)
    gone = [tag for tag in leased if tag not in delivered]  # acknowledged or requeued since
    if gone:
        r.srem(LEASED, *gone)
    candidates = [tag for tag, at in delivered.items() if tag in leased or at <= cutoff]
    if not candidates:
        return []
    pipe = r.pipeline()
    for tag in candidates:
        pipe.exists(LEASE_PREFIX + tag)
    lapsed = [tag for tag, alive in zip(candidates, pipe.execute(), strict=True) if not alive]
    if lapsed:
        with app.connection_for_write() as conn:
            qos = conn.default_channel.qos
            for tag in lapsed:
                qos.restore_by_tag(tag, leftmost=False)  # front: it was already under way
                log.warning("requeued message %s: its worker's lease lapsed (worker lost)", tag)
        r.srem(LEASED, *lapsed)  # redelivered under the same tag, it is new: leased afresh or dated
    return lapsed


def on_task_received(request: Any, hostname: str, r: redis.Redis, ttl_s: float) -> None:
    tag = getattr(getattr(request, "message", None), "delivery_tag", None)
    if tag is not None:
        grant(r, str(tag), request.id, hostname, ttl_s)

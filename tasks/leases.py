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

from tasks import requeues

log = logging.getLogger("framefleet.leases")
LEASE_PREFIX = "ff:lease:"
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
REAPER_LOCK = "ff:reaper-lock"

# delivery tag → task id of the messages this worker process holds
HELD: dict[str, str] = {}


def grant(r: redis.Redis, tag: str, task_id: str, hostname: str, ttl_s: float) -> None:
    HELD[tag] = task_id
    r.set(LEASE_PREFIX + tag, f"{hostname} {task_id}", px=int(ttl_s * 1000))


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
    cutoff = time.time() - ttl_s
    candidates = [tag for tag, _ in r.zrangebyscore(UNACKED_INDEX, "-inf", cutoff, withscores=True)]
    if not candidates:
        return []
    pipe = r.pipeline()
    for tag in candidates:
        pipe.exists(LEASE_PREFIX + tag)
    lapsed = [tag for tag, leased in zip(candidates, pipe.execute(), strict=True) if not leased]
    if lapsed:
        with app.connection_for_write() as conn:
            qos = conn.default_channel.qos
            for tag in lapsed:
                requeues.note(r, tag, "its worker was lost (its lease lapsed)")
                qos.restore_by_tag(tag, leftmost=False)  # front: it was already under way
                log.warning("requeued message %s: its worker's lease lapsed (worker lost)", tag)
    return lapsed


def on_task_received(request: Any, hostname: str, r: redis.Redis, ttl_s: float) -> None:
    tag = getattr(getattr(request, "message", None), "delivery_tag", None)
    if tag is not None:
        grant(r, str(tag), request.id, hostname, ttl_s)

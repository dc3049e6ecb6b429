"""Worker liveness in Redis: each worker's state under a key with a TTL, renewed by its heartbeat."""

from __future__ import annotations

import json
import math
from typing import Any

import redis

from tasks import keys
from tasks.delivery import queues
from worker_config.routing import QueueLoad

WORKER_PREFIX = keys.WORKER_PREFIX
GPU_QUEUES_KEY = keys.GPU_QUEUES
SEEN_KEY = keys.WORKER_SEEN  # hostname → when its state was last published (unix s), kept past the TTL


def redis_now(r: redis.Redis) -> float:
    """Redis's own clock (unix s): the one clock every host agrees on, whatever its own says."""
    seconds, micros = r.time()
    return float(seconds) + float(micros) / 1e6


def publish(r: redis.Redis, state: dict[str, Any], ttl_s: float) -> None:
    """Store ``state`` (which must hold ``hostname``) for ``ttl_s`` seconds."""
    seen = redis_now(r)
    pipe = r.pipeline()
    pipe.set(WORKER_PREFIX + state["hostname"], json.dumps(state), ex=max(1, math.ceil(ttl_s)))
    pipe.hset(SEEN_KEY, state["hostname"], str(seen))
    for queue in state.get("gpu_queues", []):
        pipe.sadd(GPU_QUEUES_KEY, queue)
    pipe.execute()


def remove(r: redis.Redis, hostname: str) -> None:
    r.delete(WORKER_PREFIX + hostname)


def absent_for_s(r: redis.Redis, hostname: str) -> float:
    """Seconds worker ``hostname`` has been missing from the registry (0 while it is there).

    A worker never seen (its record lost with a Redis restart) counts from this first look.
    """
    if r.exists(WORKER_PREFIX + hostname):
        return 0.0
    now = redis_now(r)
    r.hsetnx(SEEN_KEY, hostname, str(now))
    return max(0.0, now - float(r.hget(SEEN_KEY, hostname) or now))


def live_workers(r: redis.Redis) -> list[dict[str, Any]]:
    """The published state of every live worker: those ``ff:worker-seen`` names whose state has not
    expired (two reads, never a scan of every key: routing calls this for each GPU task it sends)."""
    names = [n.decode() if isinstance(n, bytes) else n for n in r.hkeys(SEEN_KEY)]
    found = []
    for start in range(0, len(names), 1000):
        found += [json.loads(raw) for raw in r.mget([WORKER_PREFIX + n for n in names[start : start + 1000]]) if raw]
    return found


def known_gpu_queues(r: redis.Redis) -> set[str]:
    return set(r.smembers(GPU_QUEUES_KEY))


def queue_loads(
    r: redis.Redis,
    stage: str,
    workers: list[dict[str, Any]] | None = None,
    broker: redis.Redis | None = None,
    lengths: bool = True,
) -> list[QueueLoad]:
    """Return one QueueLoad per GPU queue with a live worker hosting ``stage``.

    ``r`` holds the registry; the queues' lengths are read on ``broker`` (default ``r``), where
    the messages are when ``broker_url`` names another Redis; ``lengths=False`` reads none (``waiting`` 0).
    """
    workers = live_workers(r) if workers is None else workers
    per_queue: dict[str, dict[str, int]] = {}
    for w in workers:
        if stage not in w.get("stages", []) or w.get("gpu") is None:
            continue
        for queue in w.get("gpu_queues", []):
            entry = per_queue.setdefault(queue, {"gpu": w["gpu"], "workers": 0, "busy": 0})
            entry["workers"] += 1
            entry["busy"] += 1 if w.get("busy") else 0
    if not per_queue:
        return []
    waiting = queues.lengths(broker or r, sorted(per_queue)) if lengths else {}
    return [
        QueueLoad(name, entry["gpu"], entry["workers"], waiting.get(name, 0), entry["busy"])
        for name, entry in sorted(per_queue.items())
    ]

"""Say why a run makes no progress: a queue with waiting tasks and no live worker, or stuck workers."""

from __future__ import annotations

import time
from typing import Any

import redis

from tasks import registry
from worker_config.settings import Settings


def diagnose(r: redis.Redis, broker: redis.Redis, conf: Settings) -> list[str]:
    """Return one line per reason the queues are stuck; empty when nothing looks wrong."""
    workers = registry.live_workers(r)
    consumed = {q for w in workers for q in w.get("queues", [])}
    problems = []
    # Queues named by routing exist as lists in the broker even if no worker ever registered.
    listed = {q for q in broker.scan_iter(match=conf.gpu_queue_prefix + "*", count=500)
              if conf.gpu_index(q if isinstance(q, str) else q.decode()) is not None}
    listed = {q if isinstance(q, str) else q.decode() for q in listed}
    for queue in sorted(registry.known_gpu_queues(r) | listed | {conf.cpu_queue}):
        waiting = broker.llen(queue)
        if waiting and queue not in consumed:
            pool = "-P solo -c 1 " if queue != conf.cpu_queue else ""
            problems.append(f"queue {queue}: {waiting} tasks waiting and no live worker; start one with "
                            f"`celery -A tasks worker -Q {queue} {pool}-n {queue}@%h -E`")
    now = time.time()
    for w in workers:
        current: dict[str, Any] = w.get("current") or {}
        if not current.get("started"):
            continue
        stage = str(current.get("task", "")).rsplit(".", 1)[-1]
        running = now - current["started"]
        deadline = conf.stages[stage].deadline_s if stage in conf.stages else None
        if deadline and running > deadline:
            problems.append(f"worker {w['hostname']}: {stage} of {current.get('video')} running "
                            f"{running:.0f} s, past its {deadline:.0f} s deadline")
    return problems

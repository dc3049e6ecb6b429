"""Move tasks waiting on a GPU queue with no live worker to a live one that may run them."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import redis

from tasks import registry
from tasks.celery_app import TASK_PREFIX
from tasks.routing import job_of
from worker_config.routing import choose_gpu_queue
from worker_config.settings import Settings

log = logging.getLogger(__name__)
LOCK_KEY = "ff:rebalance-lock"

# Move a message only if it is still where we read it, so the move is exact; it joins the
# back of the target queue, which keeps the moved messages in their order.
_MOVE_IF_SAME = """
if redis.call('LINDEX', KEYS[1], ARGV[2]) == ARGV[1] then
  redis.call('LREM', KEYS[1], -1, ARGV[1])
  redis.call('LPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"""


def _decode(raw: str) -> tuple[str, dict[str, Any] | None]:
    message = json.loads(raw)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, _embed = json.loads(body)
    return message["headers"]["task"], job_of(args, kwargs)


def rebalance(r: redis.Redis, conf: Settings, max_moves: int = 100) -> int:
    """Move waiting tasks off GPU queues with no live worker; return how many moved."""
    if not r.set(LOCK_KEY, "1", nx=True, ex=max(1, int(conf.heartbeat_interval_s))):
        return 0
    workers = registry.live_workers(r)
    live = {q for w in workers for q in w.get("gpu_queues", [])}
    moved = 0
    for queue in sorted(registry.known_gpu_queues(r) - live):
        index = -1  # the oldest message; those that cannot move yet are stepped over
        while moved < max_moves:
            raw = r.lindex(queue, index)
            if raw is None:
                break
            try:
                name, job = _decode(raw)
            except (ValueError, KeyError, TypeError):
                log.error("left an undecodable message on %s", queue)
                index -= 1
                continue
            stage = name[len(TASK_PREFIX) :]
            allowed = job.get("gpus") if job else None
            target = choose_gpu_queue(registry.queue_loads(r, stage, workers), allowed, None)
            if target is None:
                index -= 1
                continue
            if r.eval(_MOVE_IF_SAME, 2, queue, target.queue, raw, index):
                moved += 1
                log.warning("moved a %s task from %s (no live worker) to %s", stage, queue, target.queue)
    return moved

"""Move tasks waiting on a GPU queue with no live worker to a live one that may run them.

A task moves only to a queue whose live workers run its stage under its run's settings (or that has no worker
hosting the stage), the rule routing applies when it sends (worker_config.settings_match.settings_route): a
worker with other settings would only send it on to a settings queue (tasks.pipeline.same_settings).
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import redis

from tasks import keys
from tasks.celery_app import TASK_PREFIX
from tasks.delivery import queues, settings_queues, transport
from tasks.delivery.routing import job_of
from tasks.job import Job
from tasks.workers import registry
from worker_config.routing import QueueLoad, choose_gpu_queue
from worker_config.settings import Settings
from worker_config.settings_match import parse_settings_queue, settings_route

log = logging.getLogger(__name__)
LOCK_KEY = keys.REBALANCE_LOCK

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


def _decode(raw: str) -> tuple[str, Job | None]:
    message = json.loads(raw)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, _embed = json.loads(body)
    return message["headers"]["task"], job_of(args, kwargs)


def rebalance(r: redis.Redis, conf: Settings, max_moves: int = 100, broker: redis.Redis | None = None) -> int:
    """Move waiting tasks off GPU queues with no live worker, then even out live queues' loads.

    ``r`` holds the registry, ``broker`` (default ``r``) the queues. Returns how many tasks
    moved. Routing at send time sees only the present: tasks sent
    before a GPU's workers registered, or before the autoscaler added workers, would
    otherwise wait behind one GPU while another idles.
    """
    if not r.set(LOCK_KEY, "1", nx=True, ex=max(1, int(conf.heartbeat_interval_s))):
        return 0
    broker = broker or r
    workers = registry.live_workers(r)
    live = {q for w in workers for q in w.get("gpu_queues", [])}
    moved = 0
    # Every GPU queue the stall report sees, not only those a worker once registered: a queue whose only
    # worker died before it was ready was never registered, and its tasks would wait there for good.
    for queue in sorted(queues.gpu_queues(broker, conf, registry.known_gpu_queues(r)) - live):
        moved += _drain(r, broker, queue, workers, max_moves - moved)
    moved += _unpark(r, broker, conf, workers, max_moves - moved)
    for stage in _queue_families(conf):
        moved += _balance(broker, registry.queue_loads(r, stage, workers, broker), workers, max_moves - moved)
    return moved


def _runs_settings(workers: list[dict[str, Any]], queue: str, stage: str, job: Job | None) -> bool:
    """Whether ``queue``'s live workers run ``stage`` under the settings ``job``'s run asks for (any settings
    for a job without them, as routing)."""
    sha256 = job.settings.get(stage) if job is not None else None
    return settings_route(queue, stage, sha256, workers) == queue


def _unpark(r: redis.Redis, broker: redis.Redis, conf: Settings, workers: list[dict[str, Any]], max_moves: int) -> int:
    """Move the tasks of a settings queue that no live worker consumes to the same settings beside another
    queue that one does (a worker with the run's settings came up on another GPU than the one they waited on)."""
    consumed = sorted({q for w in workers for q in w.get("settings_queues", [])})
    moved = 0
    for queue in settings_queues.unconsumed(r, broker, workers):
        wanted = (parse_settings_queue(queue) or ("", "", ""))[1:]
        targets = [q for q in consumed if (parse_settings_queue(q) or ("", "", ""))[1:] == wanted]
        for priority in queues.PRIORITY_STEPS if targets else ():
            source, index = queues.key_for(queue, priority), -1
            while moved < max_moves and (raw := broker.lindex(source, index)) is not None:
                job = settings_queues.job_in(raw)
                may = [t for t in targets if job is None or job.gpus is None or _gpu_of(conf, t) in job.gpus]
                if may and broker.eval(_MOVE_IF_SAME, 2, source, queues.key_for(may[0], priority), raw, index):
                    transport.ring(broker, may[0])
                    moved += 1
                    log.warning("moved a task waiting in %s (no live worker) to %s", queue, may[0])
                else:
                    index -= 1
    return moved


def _gpu_of(conf: Settings, queue: str) -> int | None:
    return conf.gpu_index((parse_settings_queue(queue) or (queue, "", ""))[0])


def _queue_families(conf: Settings) -> list[str]:
    """One GPU stage per family of GPU queues: gpuN (the stages sharing the main environment), gpuN.<stage>."""
    return [*conf.hosted_stages()[:1], *conf.own_env_stages()]


def _drain(r: redis.Redis, broker: redis.Redis, queue: str, workers: list[dict[str, Any]], max_moves: int) -> int:
    moved = 0
    for priority in queues.PRIORITY_STEPS:  # highest first, each priority's list into the same on the target
        source = queues.key_for(queue, priority)
        index = -1  # the oldest message; those that cannot move yet are stepped over
        while moved < max_moves:
            raw = broker.lindex(source, index)
            if raw is None:
                break
            try:
                name, job = _decode(raw)
            except (ValueError, KeyError, TypeError):
                log.error("left an undecodable message on %s", queue)
                index -= 1
                continue
            stage = name[len(TASK_PREFIX) :]
            loads = [
                q
                for q in registry.queue_loads(r, stage, workers, broker)
                if _runs_settings(workers, q.queue, stage, job)
            ]
            target = choose_gpu_queue(loads, job.gpus if job else None)
            if target is not None and broker.eval(
                _MOVE_IF_SAME, 2, source, queues.key_for(target.queue, priority), raw, index
            ):
                moved += 1
                log.warning("moved a %s task from %s (no live worker) to %s", stage, queue, target.queue)
            else:
                index -= 1
    return moved


def _balance(broker: redis.Redis, queue_loads: list[QueueLoad], workers: list[dict[str, Any]], max_moves: int) -> int:
    """Move tasks from the busiest live queue of a family to the least busy while that lowers the imbalance."""
    loads = {q.queue: q for q in queue_loads}
    work = {name: q.waiting + q.busy for name, q in loads.items()}
    moved = 0
    while moved < max_moves and len(loads) > 1:
        src = max(loads, key=lambda n: (work[n] / loads[n].workers, n))
        dst = min(loads, key=lambda n: (work[n] / loads[n].workers, n))
        if src == dst or (work[dst] + 1) / loads[dst].workers >= work[src] / loads[src].workers:
            break
        if not _move_one(broker, src, loads[dst], workers):
            break
        work[src] -= 1
        work[dst] += 1
        moved += 1
    if moved:
        log.info("balanced %d waiting task(s) across GPU queues", moved)
    return moved


def _move_one(r: redis.Redis, src: str, dst: QueueLoad, workers: list[dict[str, Any]]) -> bool:
    """Move the next task of ``src`` that may run on ``dst``'s GPU under its run's settings, keeping its priority;
    False when none may."""
    for priority in queues.PRIORITY_STEPS:
        source, target = queues.key_for(src, priority), queues.key_for(dst.queue, priority)
        index = -1
        while (raw := r.lindex(source, index)) is not None:
            try:
                name, job = _decode(raw)
            except (ValueError, KeyError, TypeError):
                index -= 1
                continue
            allowed = job.gpus if job else None
            may = (allowed is None or dst.gpu in allowed) and _runs_settings(
                workers, dst.queue, name[len(TASK_PREFIX) :], job
            )
            if may and r.eval(_MOVE_IF_SAME, 2, source, target, raw, index):
                transport.ring(r, dst.queue)  # wake its worker now, not at its next poll (at most 1 s)
                return True
            index -= 1
    return False

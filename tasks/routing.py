"""Send-time routing (a Celery router): GPU stages go to the least-loaded live GPU queue."""

from __future__ import annotations

import logging
from typing import Any

import redis

from tasks import queues, registry
from tasks.celery_app import TASK_PREFIX, settings
from tasks.job import Job
from tasks.redis_client import get_redis
from tasks.stages import GPU_STAGES, STAGE_NAMES
from worker_config.routing import choose_gpu_queue

log = logging.getLogger(__name__)


def job_of(args: Any, kwargs: Any) -> Job | None:
    """Return the job a stage task carries as its first argument, if any (``Job.peek``: its run and video suffice)."""
    return Job.peek(args[0] if args else (kwargs or {}).get("job"))


def route_task(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> Any:
    """Celery router: a stage task's queue (``_queue_of``) and its priority, from its place in the video's chain.

    Later stages come first (tasks.queues.stage_priority), so a started video finishes before
    the queues' earlier stages start more (setting ``stage_priorities``). Explicit send options win over these.
    """
    route = _queue_of(name, args, kwargs)
    stage = name[len(TASK_PREFIX) :]
    conf = settings()
    if route is not None and stage in STAGE_NAMES and conf.stage_priorities:
        job = job_of(args, kwargs)
        route["priority"] = queues.stage_priority(stage, (job.chain if job else ()) or conf.enabled_stages())
    return route


def _queue_of(name: str, args: Any, kwargs: Any) -> dict[str, Any] | None:
    """CPU stages and failed jobs to the cpu queue, GPU stages by live load."""
    conf = settings()
    if not name.startswith(TASK_PREFIX):
        return None
    stage = name[len(TASK_PREFIX) :]
    job = job_of(args, kwargs)
    if stage not in GPU_STAGES or job is None or job.failed:
        return {"queue": conf.cpu_queue}
    allowed = list(job.gpus) if job.gpus is not None else None
    previous = job.gpu
    try:
        loads = registry.queue_loads(get_redis(conf.redis_url), stage, broker=get_redis(conf.broker))
        choice = choose_gpu_queue(loads, allowed, previous, job.avoid_gpu)
    except redis.RedisError as exc:
        log.warning("routing %s without load readings (%s)", stage, exc)
        choice = None
    if choice is not None:
        return {"queue": choice.queue}
    fallback = previous if previous is not None else min(allowed) if allowed else 0
    log.warning(
        "no live worker hosts %s%s; queued on %s until one registers or the rebalancer moves it",
        stage,
        f" on GPUs {allowed}" if allowed else "",
        conf.stage_queue(stage, fallback),
    )
    return {"queue": conf.stage_queue(stage, fallback)}

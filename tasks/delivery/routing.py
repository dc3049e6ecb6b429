"""Send-time routing (a Celery router): GPU stages go to the least-loaded live GPU queue."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import redis

from tasks import keys
from tasks.celery_app import TASK_PREFIX, settings
from tasks.delivery import queues
from tasks.job import Job
from tasks.redis_client import get_redis
from tasks.stages import GPU_STAGES, STAGE_NAMES
from tasks.workers import registry
from worker_config.routing import choose_gpu_queue
from worker_config.settings_match import parse_settings_queue, serves, settings_route

log = logging.getLogger(__name__)
# How long the router reuses its own read of the worker registry (s). Workers publish their state
# every heartbeat (2 s by default), so the registry is already that old; re-reading it (a SCAN and an
# MGET) on every task sent was two of a transition's round trips. A worker's heartbeat also reads it
# each tick for the router (refresh_registry), so a worker sending its next stage rarely reads it at
# all. Queue lengths are read on every send.
REGISTRY_REUSE_S = 1.0
# (pid, url) -> (when read, monotonic s; the live workers; how long it may be used, s)
_registry_reads: dict[tuple[int, str], tuple[float, list[dict[str, Any]], float]] = {}


def job_of(args: Any, kwargs: Any) -> Job | None:
    """Return the job a stage task carries as its first argument, if any (``Job.peek``: its run and video suffice)."""
    return Job.peek(args[0] if args else (kwargs or {}).get("job"))


def live_workers(r: redis.Redis, url: str) -> list[dict[str, Any]]:
    """The live workers of the registry at ``url``: the last read while it is fresh enough, else a new one."""
    key = (os.getpid(), url)  # a forked child reads its own
    now = time.monotonic()
    read = _registry_reads.get(key)
    if read is None or now - read[0] > read[2]:
        read = (now, registry.live_workers(r), REGISTRY_REUSE_S)
        _registry_reads[key] = read
    return read[1]


def refresh_registry(r: redis.Redis, url: str, keep_s: float) -> None:
    """Read the registry at ``url`` now, for the router to use for up to ``keep_s`` (a worker's heartbeat)."""
    _registry_reads[(os.getpid(), url)] = (time.monotonic(), registry.live_workers(r), keep_s)


def forget_registry() -> None:
    """Read the registry afresh at the next send (after registering or removing workers by hand)."""
    _registry_reads.clear()


def route_task(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> Any:
    """Celery router: a stage task's queue (``_queue_of``) and its priority, from its place in the video's chain.

    Later stages come first (tasks.delivery.queues.stage_priority), so a started video finishes before
    the queues' earlier stages start more (setting ``stage_priorities``). Explicit send options win over these.
    """
    route = _queue_of(name, args, kwargs)
    stage = name[len(TASK_PREFIX) :]
    conf = settings()
    if route is not None and stage in STAGE_NAMES and conf.stage_priorities:
        job = job_of(args, kwargs)
        route["priority"] = queues.stage_priority(stage, (job.chain if job else ()) or conf.enabled_stages())
    return route


def for_settings(workers: list[dict[str, Any]], stage: str, sha256: str | None) -> list[dict[str, Any]]:
    """The workers that host ``stage`` under the settings ``sha256`` when any does, else all ``workers``.

    With none, the task goes where its stage is hosted, and that worker sends it on until one with the
    run's settings registers (tasks.pipeline.same_settings).
    """
    if not sha256:
        return workers
    matching = [w for w in workers if serves(w, stage, sha256)]
    return matching or workers


def _queue_of(name: str, args: Any, kwargs: Any) -> dict[str, Any] | None:
    """CPU stages and failed jobs to the cpu queue, GPU stages by live load (among workers with the run's
    settings); to a settings queue beside it where that queue's workers do not all have the run's (``_settled``)."""
    conf = settings()
    if not name.startswith(TASK_PREFIX):
        return None
    stage = name[len(TASK_PREFIX) :]
    job = job_of(args, kwargs)
    if job is None or job.failed:
        return {"queue": conf.cpu_queue}
    if stage not in GPU_STAGES:
        return {"queue": _settled(conf.cpu_queue, stage, job)}
    allowed = list(job.gpus) if job.gpus is not None else None
    previous = job.gpu
    try:
        r = get_redis(conf.redis_url)
        workers = for_settings(live_workers(r, conf.redis_url), stage, job.settings.get(stage))
        loads = registry.queue_loads(r, stage, workers, lengths=False)
        if len([q for q in loads if allowed is None or q.gpu in allowed]) > 1:
            # A choice among queues weighs their waiting tasks; a single live one is the choice whatever they are
            # (choose_gpu_queue): a host of one GPU reads no queue length, a round trip of each of its transitions.
            loads = registry.queue_loads(r, stage, workers, broker=get_redis(conf.broker))
        choice = choose_gpu_queue(loads, allowed, previous, job.avoid_gpu)
    except redis.RedisError as exc:
        log.warning("routing %s without load readings (%s)", stage, exc)
        choice = None
    if choice is not None:
        return {"queue": _settled(choice.queue, stage, job)}
    fallback = previous if previous is not None else min(allowed) if allowed else 0
    log.warning(
        "no live worker hosts %s%s; queued on %s until one registers or the rebalancer moves it",
        stage,
        f" on GPUs {allowed}" if allowed else "",
        conf.stage_queue(stage, fallback),
    )
    return {"queue": conf.stage_queue(stage, fallback)}


def _settled(queue: str, stage: str, job: Job) -> str:
    """``queue``, or its settings queue for the job's settings of ``stage`` (settings_match.settings_route),
    which is then listed in ff:settings-queues for the stall report, the sweep, the rebalancer and the autoscaler."""
    sha256 = job.settings.get(stage)
    if not sha256:
        return queue
    conf = settings()
    try:
        r = get_redis(conf.redis_url)
        target = settings_route(queue, stage, sha256, live_workers(r, conf.redis_url))
        if target != queue:
            r.sadd(keys.SETTINGS_QUEUES, target)
    except redis.RedisError as exc:
        log.warning("routing %s without the registry (%s)", stage, exc)
        return queue
    return target


def handoff_queue(stage: str, job: Job) -> str:
    """The settings queue a worker without the job's settings for ``stage`` sends its task to: beside the
    queue routing picks (a GPU where a worker has them, if any does), whoever else consumes it."""
    from worker_config.settings_match import settings_queue

    sha256 = job.settings[stage]
    route = _queue_of(TASK_PREFIX + stage, (job.to_dict(),), {}) or {"queue": settings().cpu_queue}
    parsed = parse_settings_queue(route["queue"])
    target = route["queue"] if parsed else settings_queue(route["queue"], stage, sha256)
    if not parsed:
        try:
            get_redis(settings().redis_url).sadd(keys.SETTINGS_QUEUES, target)
        except redis.RedisError as exc:
            log.warning("%s not listed in %s (%s)", target, keys.SETTINGS_QUEUES, exc)
    return target

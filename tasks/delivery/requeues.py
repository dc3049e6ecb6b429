"""Requeues of a run's messages after their worker was lost: a list per run in Redis, read by the
progress display (one line each) and by the statistics callback (run_summary.json's ``requeued``)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis

from tasks import keys
from tasks.job import Job
from tasks.run.cancel import decode, run_of

log = logging.getLogger("framefleet.requeues")


def key(run_id: str) -> str:
    return keys.REQUEUES_PREFIX + run_id


def record(r: redis.Redis, unacked_entry: str | bytes | None, why: str, ttl_s: int) -> None:
    """Note that the message in ``unacked_entry`` (kombu's ``[message, exchange, routing key]``) was requeued."""
    if not unacked_entry:
        return
    try:
        name, task_id, args = decode(json.dumps(json.loads(unacked_entry)[0]))
    except (ValueError, KeyError, TypeError, IndexError):
        return
    run = run_of(args)
    if run is None:
        return
    job = Job.peek(args[0])
    entry = {
        "time": time.time(),
        "task": task_id,
        "stage": name.rsplit(".", 1)[-1],
        "video_id": job.video_id if job else None,
        "video": job.video if job else None,
        "why": why,
    }
    pipe = r.pipeline()
    pipe.rpush(key(run), json.dumps(entry))
    pipe.expire(key(run), ttl_s)
    pipe.execute()


def read(r: redis.Redis, run_id: str, start: int = 0) -> list[dict[str, Any]]:
    """The run's requeues from the ``start``-th on, oldest first."""
    return [json.loads(raw) for raw in r.lrange(key(run_id), start, -1)]


def line(entry: dict[str, Any]) -> str:
    """One progress line for a requeue."""
    return f"requeued {entry['stage']} of {entry.get('video') or entry.get('video_id')}: {entry['why']}"


def note(broker: redis.Redis, tag: str, why: str) -> None:
    """Record the requeue of message ``tag`` (read from kombu's unacked hash before it is restored); never raises."""
    from tasks.celery_app import settings
    from tasks.redis_client import get_redis

    try:
        conf = settings()
        record(get_redis(conf.redis_url), broker.hget("unacked", tag), why, conf.result_expires_s)  # kombu's hash
    except Exception as exc:  # the requeue matters, not its record
        log.warning("requeue of message %s not recorded: %s", tag, exc)

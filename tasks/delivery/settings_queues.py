"""The settings queues (worker_config.settings_match.settings_queue) in Redis: those routing has sent to, and
those whose tasks wait with no live worker consuming them."""

from __future__ import annotations

import base64
import json
from typing import Any

import redis

from tasks import keys
from tasks.delivery import queues
from tasks.job import Job


def listed(r: redis.Redis) -> set[str]:
    """Every settings queue routing has sent to (``ff:settings-queues``)."""
    return {q if isinstance(q, str) else q.decode() for q in r.smembers(keys.SETTINGS_QUEUES)}


def unconsumed(r: redis.Redis, broker: redis.Redis, workers: list[dict[str, Any]]) -> dict[str, int]:
    """The settings queues with tasks waiting and no live worker consuming them: queue -> tasks waiting."""
    consumed = {q for w in workers for q in w.get("settings_queues", [])}
    waiting = queues.lengths(broker, sorted(listed(r) - consumed))
    return {queue: n for queue, n in waiting.items() if n}


def first_job(broker: redis.Redis, queue: str) -> Job | None:
    """The job of the next task ``queue`` gives, or None (empty, or not a stage task)."""
    for _key, raw in queues.waiting(broker, queue)[:1]:
        return job_in(raw)
    return None


def job_in(raw: str | bytes) -> Job | None:
    """The job a kombu message as it sits in a queue carries, or None."""
    try:
        message = json.loads(raw)
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs, _embed = json.loads(body)
        return Job.peek(args[0] if args else (kwargs or {}).get("job"))
    except (ValueError, KeyError, TypeError, IndexError):
        return None

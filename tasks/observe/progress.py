"""Per-run progress counters in Redis (fields ``<stage>.done|failed`` of the run's hash), read by the progress bar."""

from __future__ import annotations

from typing import Any

import redis

from tasks import keys
from tasks.stages import dataset_stage


def run_key(run_id: str) -> str:
    return keys.RUN_PREFIX + run_id


def record(r: redis.Redis, run_id: str, stage: str, ok: bool, ttl_s: int) -> None:
    """Count one finished (``ok``) or failed stage task of a run."""
    pipe = r.pipeline()
    add(pipe, run_id, stage, ok, ttl_s)
    pipe.execute()


def add(pipe: Any, run_id: str, stage: str, ok: bool, ttl_s: int) -> None:
    """Queue on ``pipe`` (a Redis pipeline; the caller executes it) the counting of one stage task of a run."""
    key = run_key(run_id)
    pipe.hincrby(key, f"{stage}.{'done' if ok else 'failed'}", 1)
    if not ok:
        pipe.hincrby(key, "videos.failed", 1)
    elif stage == dataset_stage().name:
        pipe.hincrby(key, "videos.done", 1)
    pipe.expire(key, ttl_s)


COUNTER_ENDS = (".done", ".failed")


def read(r: redis.Redis, run_id: str) -> dict[str, int]:
    """The run's counters (its hash holds its record and end too: those are left out)."""
    found = r.hgetall(run_key(run_id))
    return {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in found.items() if _counter(k)}


def _counter(field: str | bytes) -> bool:
    return (field.decode() if isinstance(field, bytes) else field).endswith(COUNTER_ENDS)

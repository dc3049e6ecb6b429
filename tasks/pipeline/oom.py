"""After a GPU out-of-memory error: free the cache, report it, and shape the retry (the Oom hook of a stage task)."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import re
import sys
import time
from typing import Any

import redis

from tasks import keys
from tasks.celery_app import settings
from tasks.errors import GpuOutOfMemory
from tasks.job import Job
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.redis_client import get_redis
from tasks.stages import ModelStage
from tasks.workers import worker

log = logging.getLogger("framefleet.oom")
OOM_KEY = keys.OOM_LOG
MIB = 1 << 20


def stage_peak_mib(stage: Any, message: str = "") -> float:
    """The device memory the failed call needed, in MiB: what the process held at its peak plus
    the allocation that failed (from torch's message), or the model's own last peak if larger."""
    reported = float(stage.peak_memory_bytes) / MIB if isinstance(stage, ModelStage) else 0.0
    held = 0.0
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        held = torch.cuda.max_memory_reserved() / MIB
    tried = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB)", message)
    wanted = float(tried.group(1)) * (1024 if tried.group(2) == "GiB" else 1) if tried else 0.0
    return max(reported, held + wanted)


def set_chunk_scale(stage: Any, scale: float) -> None:
    """Tell a stage's model to use ``scale`` of its activation memory (models without chunks ignore it)."""
    if isinstance(stage, ModelStage):
        stage.chunk_scale = scale


def release_memory() -> None:
    """Free cached CUDA memory: only after an OOM, never after every task."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def after_oom(
    r: redis.Redis | None,
    stage_name: str,
    stage: Any,
    job: Job,
    gpu: int | None,
    hostname: str,
    message: str = "",
) -> Job:
    """Release memory, record the OOM for the autoscaler; return the job of the retry."""
    peak = stage_peak_mib(stage, message)
    release_memory()
    record = {
        "gpu": gpu,
        "worker": hostname,
        "pid": os.getpid(),
        "stage": stage_name,
        "video_id": job.video_id,
        "peak_mib": peak,
        "time": time.time(),
    }
    if r is not None:
        try:
            r.lpush(OOM_KEY, json.dumps(record))
            r.ltrim(OOM_KEY, 0, 999)
        except redis.RedisError as exc:
            log.warning("OOM not recorded: %s", exc)
    scale = max(job.chunk_scale / 2, 1 / 64)
    return dataclasses.replace(job, avoid_gpu=gpu, chunk_scale=scale, oom_peak_mib=max(peak, job.oom_peak_mib))


class Oom(StageHook):
    """Run the model at the job's chunk scale; after an OOM, record it and halve the scale for the retry elsewhere."""

    def before_run(self, call: StageCall, stage: Any) -> None:
        set_chunk_scale(stage, float(call.job.chunk_scale))

    def after_failure(self, call: StageCall, failure: Exception) -> Exception:
        if not isinstance(failure, GpuOutOfMemory):
            return failure
        # Retry elsewhere if possible, with smaller chunks; the autoscaler reads the record.
        call.job = after_oom(
            _redis_or_none(settings().redis_url),
            call.stage_name,
            worker.STAGES.get(call.stage_name),
            call.job,
            worker.ROLE.gpu,
            call.task.request.hostname,
            str(failure),
        )
        return GpuOutOfMemory(
            f"{failure} (peak {call.job.oom_peak_mib:.0f} MiB; chunk scale now {call.job.chunk_scale:g})",
            failure.delay_s,
        )


def _redis_or_none(url: str) -> Any:
    """A client for ``url`` that has answered a ping, or None (the client connects lazily)."""
    try:
        client = get_redis(url)
        client.ping()
        return client
    except Exception:
        return None

"""After a GPU out-of-memory error: free the cache, report it, and shape the retry."""

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
from tasks.job import Job
from tasks.stages import ModelStage

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

"""``celery -A tasks inspect gpu``: an idle worker's state and the readings of its GPU.

A busy solo worker cannot answer remote control; its state is in the Redis registry
(``scripts/status.py`` shows both).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from celery.worker.control import inspect_command

from tasks.gpu import GpuReading, open_probe, uuid_of_visible_device
from tasks.gpu.fake import INDEX_ENV
from tasks.workers import worker

log = logging.getLogger("framefleet.inspect")


def gpu_reading() -> dict[str, Any]:
    """The probe's reading of this worker's GPU and of this process on it; ``gpu`` None when there is none."""
    role = worker.ROLE
    if role.gpu is None:
        return {"probe": "none", "gpu": None, "reason": "not a GPU worker"}
    probe = open_probe()
    try:
        readings = probe.gpus()
        mine = _pick(readings, probe.mode, role.gpu)
        used = sum(p.used_mib for p in probe.processes() if p.pid == os.getpid() and mine and p.gpu == mine.index)
    finally:
        probe.close()
    if mine is None:
        reason = getattr(probe, "reason", f"the probe ({probe.mode}) has no reading for gpu{role.gpu}")
        return {"probe": probe.mode, "gpu": None, "reason": reason}
    return {"probe": probe.mode, "gpu": dataclasses.asdict(mine), "process_used_mib": used}


def _pick(readings: list[GpuReading], mode: str, queue_index: int) -> GpuReading | None:
    if mode == "nvml":
        # The queue index is not the NVML index in a container or under Slurm; the UUID is exact.
        uuid = uuid_of_visible_device()
        return next((g for g in readings if g.uuid == uuid), None)
    index = int(os.environ.get(INDEX_ENV, queue_index))
    return next((g for g in readings if g.index == index), None)


def _done_by_the_pool() -> int:
    from celery.worker import state as celery_state

    return max(0, celery_state.all_total_count[0] - len(celery_state.active_requests))


@inspect_command()
def gpu(state: Any) -> dict[str, Any]:
    """This worker's state (queues, stages, memory, current task) and the readings of its GPU."""
    reply: dict[str, Any] = {"worker": worker.worker_state()}
    # A prefork worker runs its tasks in child processes, whose counts this process never sees;
    # Celery's own count of the tasks this process handed out and got back covers them.
    reply["worker"]["tasks_done"] = max(reply["worker"].get("tasks_done", 0), _done_by_the_pool())
    try:
        reply.update(gpu_reading())
    except Exception as exc:  # a reply with the reason beats a silent worker
        log.warning("GPU not read for inspect gpu: %s", exc)
        reply.update(probe="error", gpu=None, reason=f"{type(exc).__name__}: {exc}")
    return reply

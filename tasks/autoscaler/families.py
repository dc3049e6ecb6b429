"""A GPU's worker families: one per queue, ``gpuN`` for the stages of the main environment and
``gpuN.<stage>`` for each stage with an interpreter of its own."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.autoscaler.supervisor import queue_of, worker_argv
from worker_config.settings import Settings


@dataclass(frozen=True)
class Family:
    """The workers of one queue on one GPU: ``gpuN`` hosts the stages of the main environment,
    ``gpuN.<stage>`` one stage with its own python (its workers start from that interpreter)."""

    gpu: int
    queue: str
    stages: tuple[str, ...]
    python: str | None = None


def families(conf: Settings, gpu: int) -> list[Family]:
    """The worker families of GPU ``gpu`` under ``conf``: ``gpuN`` (when a GPU stage shares the main
    environment), then ``gpuN.<stage>`` for each stage with its own python."""
    found = [Family(gpu, conf.gpu_queue(gpu), conf.hosted_stages())] if conf.hosted_stages() else []
    return found + [
        Family(gpu, conf.stage_queue(stage, gpu), conf.hosted_stages(stage), conf.stages[stage].python)
        for stage in conf.own_env_stages()
    ]


def family_argv(conf: Settings, gpu: int, name: str) -> list[str]:
    """The command of the worker ``name`` (``<queue>-<n>``) of GPU ``gpu``, from its family's interpreter."""
    queue = queue_of(name)
    python = next((f.python for f in families(conf, gpu) if f.queue == queue), None)
    return worker_argv(queue, name, python=python)

"""A GPU's worker families: one per queue, ``gpuN`` for the stages of the main environment and
``gpuN.<stage>`` for each stage with an interpreter of its own, under the autoscaler's settings; and one
per queue and other settings that waiting tasks need (tasks.autoscaler.run_settings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.autoscaler.supervisor import queue_of, worker_argv
from tasks.stages import STAGE_NAMES
from worker_config.settings import Settings, stage_entry
from worker_config.settings_match import SETTINGS_QUEUE_SEP, settings_queue


@dataclass(frozen=True)
class Family:
    """The workers of one queue on one GPU under one set of settings: ``gpuN`` hosts the stages of the main
    environment, ``gpuN.<stage>`` one stage with its own python (its workers start from that interpreter).

    ``tag``: "" for the autoscaler's own settings, else a few characters of the hash of the settings its
    workers run (``config``: the settings file they start from); ``settings_queues``: the settings
    queues they consume besides ``queue`` (tasks.workers.worker.settings_queues).
    """

    gpu: int
    queue: str
    stages: tuple[str, ...]
    python: str | None = None
    tag: str = ""
    config: str | None = field(default=None, compare=False)
    settings_queues: tuple[str, ...] = field(default=(), compare=False)
    conf: Settings | None = field(default=None, compare=False, repr=False)

    @property
    def position(self) -> int:
        """Where its first stage comes in the chain: a family of a smaller position feeds those of larger ones."""
        return STAGE_NAMES.index(self.stages[0])

    @property
    def key(self) -> str:
        """The family's name among a GPU's: its queue, with ``~<tag>`` for other settings than the autoscaler's."""
        return f"{self.queue}{SETTINGS_QUEUE_SEP}{self.tag}" if self.tag else self.queue


def with_settings_queues(conf: Settings, family: Family) -> Family:
    """``family`` with the settings queues its workers, started under ``conf``, consume."""
    found = tuple(settings_queue(family.queue, s, stage_entry(conf, s)["sha256"]) for s in family.stages)
    return Family(family.gpu, family.queue, family.stages, family.python, family.tag, family.config, found, conf)


def families(conf: Settings, gpu: int) -> list[Family]:
    """The worker families of GPU ``gpu`` under ``conf``: ``gpuN`` (when a GPU stage shares the main
    environment), then ``gpuN.<stage>`` for each stage with its own python."""
    found = [Family(gpu, conf.gpu_queue(gpu), conf.hosted_stages())] if conf.hosted_stages() else []
    return found + [
        Family(gpu, conf.stage_queue(stage, gpu), conf.hosted_stages(stage), conf.stages[stage].python)
        for stage in conf.own_env_stages()
    ]


def family_argv(conf: Settings, gpu: int, name: str) -> list[str]:
    """The command of the worker ``name`` (``<family key>-<n>``) of GPU ``gpu``, from its family's interpreter."""
    queue = queue_of(name).partition(SETTINGS_QUEUE_SEP)[0]
    python = next((f.python for f in families(conf, gpu) if f.queue == queue), None)
    return worker_argv(queue, name, python=python)

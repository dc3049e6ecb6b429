"""Before a run starts: do the live workers run its stage settings? If not, say per stage what differs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import redis

from tasks.errors import DatasetError
from tasks.workers import registry
from worker_config.settings import CONFIG_ENV, Settings, run_stage_settings
from worker_config.settings_match import explain, unserved

# The environment variables that decide stage settings (worker_config.settings): each stage's, and the
# backend of a model stage whose settings name none (tasks.backends.defaults).
STAGE_ENV_PREFIX = "FRAMEFLEET_STAGES__"
DEFAULT_BACKENDS_ENV = "FRAMEFLEET_DEFAULT_BACKENDS"


class WorkersDiffer(DatasetError):
    """Live workers host the run's stages, none under the run's settings; the message names the difference."""


def run_settings(conf: Settings) -> dict[str, Any]:
    """What a run records of its settings: each stage's (``run_stage_settings``), the settings file and
    the environment variables they came from (to name the worker that matches)."""
    return {
        "stage_settings": run_stage_settings(conf),
        "config": os.environ.get(CONFIG_ENV) or None,
        "settings_env": {
            k: v for k, v in os.environ.items() if k.startswith(STAGE_ENV_PREFIX) or k == DEFAULT_BACKENDS_ENV
        },
    }


def differences(record: Mapping[str, Any], workers: list[dict[str, Any]], cpu_queue: str) -> list[str]:
    """One line per stage of the run (``record``: what ``run_settings`` gave) that live workers host, none
    under its settings, then how to start workers that match; empty when every such stage is served."""
    stages = (record.get("stage_settings") or {}).get("stages") or {}
    gaps = unserved(stages, workers)
    if not gaps:
        return []
    tag = str(record["stage_settings"].get("sha256", ""))[:8]
    return explain(gaps, record.get("config"), record.get("settings_env") or {}, cpu_queue, tag)


def check(r: redis.Redis, conf: Settings, record: Mapping[str, Any], wait_for_workers: bool) -> list[str]:
    """Refuse a run no live worker can serve (WorkersDiffer); with ``wait_for_workers``, return the lines instead."""
    lines = differences(record, registry.live_workers(r), conf.cpu_queue)
    if lines and not wait_for_workers:
        detail = "\n  ".join(lines)
        raise WorkersDiffer(
            "the live workers do not run this run's stage settings, so nothing was sent:\n  "
            f"{detail}\n  or pass --wait-for-workers to enqueue anyway for workers that will come"
        )
    return lines

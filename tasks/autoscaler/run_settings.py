"""Worker families for the settings waiting tasks need: a run whose stage no live worker runs under its
settings waits in a settings queue (worker_config.settings_match.settings_queue); the autoscaler writes the
run's recorded stage settings to a file and starts a family of workers from it on the GPU it waits on."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tasks.autoscaler.families import Family, with_settings_queues
from tasks.stages import GPU_STAGES, STAGE_NAMES
from worker_config.settings import CONFIG_ENV, ConfigError, Settings, load_settings, stage_entry
from worker_config.settings_match import parse_settings_queue

log = logging.getLogger("framefleet.autoscaler")


class CannotMatch(ValueError):
    """The run's settings cannot be given to a worker here; the message says which stage and why."""


def family_tag(stages: Mapping[str, Mapping[str, Any]], hosted: tuple[str, ...]) -> str:
    """A few characters naming the settings of the ``hosted`` stages (``stages``: a run's entries)."""
    text = json.dumps({s: stages[s]["sha256"] for s in hosted}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def hosted_on(queue: str, stages: Mapping[str, Mapping[str, Any]], conf: Settings) -> tuple[str, ...]:
    """The run's stages a worker of ``queue`` (gpuN, or gpuN.<stage>) hosts under the run's settings."""
    own = queue.partition(".")[2]
    if own:
        return (own,) if own in stages else ()
    return tuple(s for s in stages if s in GPU_STAGES and not _python(s, stages, conf))


def _python(stage: str, stages: Mapping[str, Mapping[str, Any]], conf: Settings) -> str | None:
    """The stage's interpreter on this host: the autoscaler's own setting, else the run's."""
    return conf.stages[stage].python or stages[stage].get("python")


def settings_text(conf: Settings, stages: Mapping[str, Mapping[str, Any]]) -> str:
    """The autoscaler's settings file (``$FRAMEFLEET_CONFIG``, else none) with the run's ``stages`` in place of
    its own: each stage's backend and parameters as the run recorded them, the host-local ones (paths,
    batch sizes) this host's own where its backend is the same, and every stage the run leaves out off."""
    path = os.environ.get(CONFIG_ENV)
    data: dict[str, Any] = dict(yaml.safe_load(Path(path).read_text()) or {}) if path else {}
    written: dict[str, Any] = {}
    for name in STAGE_NAMES:
        entry = stages.get(name)
        if entry is None:
            written[name] = {"enabled": False}
            continue
        mine = stage_entry(conf, name)
        local = mine["local"] if mine["backend"] == entry["backend"] else {}
        settings = entry["settings"]
        written[name] = {
            "enabled": settings.get("enabled", True),
            "backend": settings["backend"],
            "params": {**(entry.get("local") or {}), **local, **settings.get("params", {})},
        }
        if python := _python(name, stages, conf):
            written[name]["python"] = python
    data["stages"] = written
    return yaml.safe_dump(data, sort_keys=True)


def family_for(
    conf: Settings, gpu: int, queue: str, stages: Mapping[str, Mapping[str, Any]], folder: Path
) -> Family | None:
    """The family of ``queue`` on ``gpu`` whose workers run the run's ``stages``, its settings file written in
    ``folder``; None when the run has no stage for ``queue``. Raises CannotMatch when the file does not give
    the run's settings here (a stage setting this host's environment overrides, a backend it lacks)."""
    hosted = hosted_on(queue, stages, conf)
    if not hosted:
        return None
    tag = family_tag(stages, hosted)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{tag}.yaml"
    path.write_text(settings_text(conf, stages))
    try:
        theirs = load_settings(path)
    except ConfigError as exc:
        raise CannotMatch(f"the run's settings are refused here: {exc}") from exc
    for stage in hosted:
        got = stage_entry(theirs, stage)["sha256"]
        if got != stages[stage]["sha256"]:
            raise CannotMatch(
                f"{stage}: {path} gives settings {got:.12} here, the run's are {stages[stage]['sha256']:.12} "
                f"(an environment variable FRAMEFLEET_STAGES__… of the autoscaler, or a backend default of "
                f"another framefleet version); start a matching worker by hand"
            )
    family = Family(gpu, queue, hosted, _python(hosted[0], stages, conf), tag, str(path))
    return with_settings_queues(theirs, family)


def base_on(conf: Settings, settings_queue: str, gpu: int) -> str | None:
    """The GPU queue of ``gpu`` beside which ``settings_queue`` lies, or None (another GPU's, or the cpu queue's)."""
    parsed = parse_settings_queue(settings_queue)
    if parsed is None or conf.gpu_index(parsed[0]) != gpu:
        return None
    return parsed[0]

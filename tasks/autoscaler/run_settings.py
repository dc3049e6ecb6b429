"""Worker families for the settings waiting tasks need: a run whose stage no live worker runs under its
settings waits in a settings queue (worker_config.settings_match.settings_queue); the autoscaler writes the
run's recorded stage settings to a file and starts a family of workers from it on the GPU it waits on."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis
import yaml

from tasks.autoscaler.families import Family, families, with_settings_queues
from tasks.autoscaler.policy import AutoscalePolicy
from tasks.autoscaler.supervisor import Supervisor
from tasks.delivery import settings_queues
from tasks.run import runs
from tasks.stages import GPU_STAGES, STAGE_NAMES
from worker_config.settings import (
    CONFIG_ENV,
    HOST_FILE_PARAMS,
    LOCAL_PARAM_NAMES,
    ConfigError,
    Settings,
    load_settings,
    stage_entry,
)
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
    """The stage's interpreter on this host: the autoscaler's own setting only.

    A run's record names the interpreter of the host that enqueued it; taken here, a record written by
    anyone who reaches Redis would choose the program this host starts.
    """
    return conf.stages[stage].python


def _hashed_params(stage: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` of a run's record less any host-local one (``worker_config.settings.LOCAL_PARAM_NAMES``).

    A record's hashed parameters never hold those (``stage_entry`` moves them to ``local``); one that does
    was written by hand, and a path it names must not reach this host's workers.
    """
    dropped = sorted(set(params) & set(LOCAL_PARAM_NAMES))
    if dropped:
        log.warning("%s: the run's record names host-local parameters %s; this host's own are used", stage, dropped)
    return {k: v for k, v in params.items() if k not in LOCAL_PARAM_NAMES}


def _host_files(stage: str, params: Mapping[str, Any], mine: Mapping[str, Any] | None) -> dict[str, Any]:
    """``params`` (a run's hashed ones) with each file a loader opens (``HOST_FILE_PARAMS``) this host's own:
    ``mine``, this host's hashed parameters of the same backend (None for another backend: its defaults).

    A record forged by anyone who reaches Redis could name a checkpoint on shared storage, which the loader would
    unpickle; the record's value only has to agree (``family_for`` compares the hashes, and refuses otherwise).
    """
    own = {k: v for k, v in (mine or {}).items() if k in HOST_FILE_PARAMS}
    differ = sorted(k for k in HOST_FILE_PARAMS if k in params and params[k] != own.get(k))
    if differ:
        log.warning("%s: the run's record names files %s; this host's own are used", stage, differ)
    return {**{k: v for k, v in params.items() if k not in HOST_FILE_PARAMS}, **own}


def settings_text(conf: Settings, stages: Mapping[str, Mapping[str, Any]]) -> str:
    """The autoscaler's settings file (``$FRAMEFLEET_CONFIG``, else none) with the run's ``stages`` in place of
    its own: each stage's backend and parameters as the run recorded them, the host-local ones (paths,
    batch sizes), the files a loader opens (checkpoints: ``_host_files``) and the interpreter this host's
    own (never the record's: a record may come from anyone who reaches Redis, ``repo_dir`` goes first on
    ``sys.path`` and a checkpoint is unpickled), and every stage the run leaves out off;
    its workers consume only the settings queues (``settings_queues_only``)."""
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
        ours = mine["settings"]["params"] if mine["backend"] == entry["backend"] else None
        hashed = _host_files(name, _hashed_params(name, settings.get("params", {})), ours)
        written[name] = {
            "enabled": settings.get("enabled", True),
            "backend": settings["backend"],
            "params": {**local, **hashed},
        }
        if python := _python(name, stages, conf):
            written[name]["python"] = python
    data["stages"] = written
    data["settings_queues_only"] = True  # its workers take only the tasks that need these settings
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
    own = queue.partition(".")[2]
    if own and not _python(own, stages, conf):
        raise CannotMatch(
            f"{own}: the run's tasks wait for a worker of {queue}, a stage with its own environment, but this "
            f"host's settings give no stages.{own}.python (a run's record never names the interpreter here); "
            f"set stages.{own}.python in this host's settings"
        )
    tag = family_tag(stages, hosted)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{tag}.yaml"
    # Mode 0600: the file copies the autoscaler's settings file, whose redis_url may hold Redis's password.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(settings_text(conf, stages))
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


class FamilyBook:
    """The worker families of each GPU: the autoscaler's own settings' (``families``), and one per queue and
    other settings that tasks wait for in a settings queue no live worker consumes (``adopt``), kept until
    they have no worker and nothing waits for them (``forget_idle``).

    ``folder``: where the other settings' files are written (default: a temporary folder, made when first needed).
    """

    def __init__(self, conf: Settings, r: redis.Redis, broker: redis.Redis, folder: Path | None = None) -> None:
        self.conf, self.r, self.broker, self.folder = conf, r, broker, folder
        self.own: dict[int, list[Family]] = {}  # per GPU, with their settings queues
        self.other: dict[int, dict[str, Family]] = {}  # per GPU: family key -> a family of a run's settings
        self._said: dict[str, str] = {}  # settings queue -> why no family here serves it (logged once)

    def of(self, gpu: int) -> list[Family]:
        """GPU ``gpu``'s families: the autoscaler's own settings', then those of runs' other settings."""
        if gpu not in self.own:
            self.own[gpu] = [with_settings_queues(self.conf, f) for f in families(self.conf, gpu)]
        return self.own[gpu] + list(self.other.get(gpu, {}).values())

    def adopt(self, gpu: int, waiting: Mapping[str, int]) -> None:
        """Add a family for each settings queue of GPU ``gpu`` among ``waiting`` (tasks, no live consumer) that
        no family of it consumes: from the settings of the run of the first task waiting there."""
        for queue in waiting:
            base = base_on(self.conf, queue, gpu)
            if base is None or any(queue in f.settings_queues for f in self.of(gpu)):
                continue
            job = settings_queues.first_job(self.broker, queue)
            record = runs.lookup(self.r, job.run_id) if job is not None else None
            stages = ((record or {}).get("stage_settings") or {}).get("stages")
            try:
                if job is None or not stages:
                    raise CannotMatch("the run's record (its settings) is not in Redis")
                if self.folder is None:
                    self.folder = Path(tempfile.mkdtemp(prefix="framefleet-settings-"))
                family = family_for(self.conf, gpu, base, stages, self.folder)
            except (CannotMatch, ValueError, KeyError) as exc:
                if self._said.get(queue) != str(exc):
                    log.warning("GPU %d: no workers for the tasks waiting in %s: %s", gpu, queue, exc)
                    self._said[queue] = str(exc)
                continue
            if family is None or any(f.key == family.key for f in self.of(gpu)):
                continue
            self.other.setdefault(gpu, {})[family.key] = family
            log.info(
                "GPU %d: family %s for run %s's settings (%s, from %s): its tasks wait in %s",
                gpu,
                family.key,
                job.run_id,
                "+".join(family.stages),
                family.config,
                queue,
            )

    @staticmethod
    def backlog(family: Family, waiting: Mapping[str, int]) -> int:
        """Tasks waiting for ``family`` (``waiting``: queue -> tasks): in its settings queues, and in its queue
        for the autoscaler's own settings."""
        own = 0 if family.tag else waiting.get(family.queue, 0)
        return own + sum(waiting.get(q, 0) for q in family.settings_queues)

    @staticmethod
    def policy_for(family: Family, policy: AutoscalePolicy) -> AutoscalePolicy:
        """``policy``; for a family of a run's other settings, down to no worker once idle."""
        return dataclasses.replace(policy, min_workers_per_gpu=0) if family.tag else policy

    def forget_idle(self, gpu: int, supervisor: Supervisor, waiting: Mapping[str, int]) -> list[str]:
        """Drop GPU ``gpu``'s families of other settings with no worker left and nothing waiting; return their keys."""
        gone = []
        for key, family in list(self.other.get(gpu, {}).items()):
            if supervisor.active(gpu, key) or supervisor.stopping(gpu, key) or self.backlog(family, waiting):
                continue
            del self.other[gpu][key]
            gone.append(key)
            log.info("GPU %d: family %s gone: no worker and nothing waiting for its settings", gpu, key)
        return gone

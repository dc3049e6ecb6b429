"""Whether live workers run a run's stage settings, and how to say what differs: pure functions on plain data.

A run's stage entry and a worker's advertised one are ``worker_config.settings.stage_entry``'s:
``{"backend", "settings": {"enabled", "backend", "params"}, "sha256", "local", "python"}``. A worker
advertises one per stage it hosts (``settings`` in its registry state) and the settings file it
was started from (``config``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CONFIG_ENV = "FRAMEFLEET_CONFIG"
# A settings queue, ``<queue>~<stage>-<sha256[:12]>``: the tasks of ``stage`` that must run under those settings,
# where ``queue``'s workers do not all have them. Only workers with them consume it (each worker consumes one
# per queue and stage it hosts), so a task sent there is never taken by a worker that would send it on again.
SETTINGS_QUEUE_SEP = "~"
SETTINGS_QUEUE_HASH_CHARS = 12


@dataclass(frozen=True)
class Unserved:
    """A stage of a run that live workers host, none of them under the run's settings."""

    stage: str
    run: Mapping[str, Any]  # the run's entry for the stage
    workers: Sequence[Mapping[str, Any]] = field(default_factory=list)  # the hosting workers' registry states


def advertised(worker: Mapping[str, Any], stage: str) -> Mapping[str, Any] | None:
    """The settings ``worker`` advertises for ``stage``, or None (it does not host it, or predates advertising)."""
    if stage not in worker.get("stages", []):
        return None
    entry = (worker.get("settings") or {}).get(stage)
    return entry if isinstance(entry, Mapping) else None


def serves(worker: Mapping[str, Any], stage: str, sha256: str) -> bool:
    """Whether ``worker`` hosts ``stage`` under the settings whose hash is ``sha256``."""
    entry = advertised(worker, stage)
    return entry is not None and entry.get("sha256") == sha256


def unserved(run_stages: Mapping[str, Mapping[str, Any]], workers: Sequence[Mapping[str, Any]]) -> list[Unserved]:
    """The run's stages that live workers host but none under the run's settings.

    A stage no live worker hosts at all is not among them: its tasks wait for a worker as any
    run's do (the stall report names the queue).
    """
    found = []
    for stage, entry in run_stages.items():
        hosts = [w for w in workers if stage in w.get("stages", [])]
        if hosts and not any(serves(w, stage, entry["sha256"]) for w in hosts):
            found.append(Unserved(stage, entry, hosts))
    return found


def settings_queue(queue: str, stage: str, sha256: str) -> str:
    """The settings queue of ``stage`` under the settings ``sha256`` beside ``queue`` (cpu, gpuN, gpuN.<stage>)."""
    return f"{queue}{SETTINGS_QUEUE_SEP}{stage}-{sha256[:SETTINGS_QUEUE_HASH_CHARS]}"


def parse_settings_queue(name: str) -> tuple[str, str, str] | None:
    """(queue, stage, the hash's first characters) of a settings queue; None for any other queue name."""
    queue, sep, rest = name.partition(SETTINGS_QUEUE_SEP)
    stage, dash, digest = rest.rpartition("-")
    if not sep or not dash or not stage or len(digest) != SETTINGS_QUEUE_HASH_CHARS:
        return None
    return queue, stage, digest


def settings_route(queue: str, stage: str, sha256: str | None, workers: Sequence[Mapping[str, Any]]) -> str:
    """Where a task of ``stage`` that routing sent to ``queue`` goes: ``queue`` itself when every live worker
    of ``queue`` hosting the stage has the run's settings (or none hosts it there: it waits for one as any
    task does), else the settings queue, which only those with them consume (none yet: it waits there for
    one, and the stall report and the autoscaler read it)."""
    if not sha256:
        return queue  # a job of an earlier version: any worker runs it
    hosts = [w for w in workers if queue in w.get("queues", []) and stage in w.get("stages", [])]
    if not hosts or all(serves(w, stage, sha256) for w in hosts):
        return queue
    return settings_queue(queue, stage, sha256)


def _params(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(((entry or {}).get("settings") or {}).get("params") or {})


def label(entry: Mapping[str, Any] | None, against: Mapping[str, Any] | None) -> str:
    """``entry``'s backend, with the parameters whose values differ from ``against``'s when the backends agree."""
    if entry is None:
        return "unknown settings (a framefleet that does not advertise them)"
    backend = str(entry.get("backend"))
    if against is None or against.get("backend") != backend:
        return backend
    mine, theirs = _params(entry), _params(against)
    differ = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    if not differ:
        return backend
    return backend + " {" + ", ".join(f"{k}: {mine.get(k, '(unset)')}" for k in differ) + "}"


def describe(gap: Unserved) -> str:
    """``depth: classical (run) vs synthetic (workers gpu0@host)``, one group per distinct worker setting."""
    groups: dict[str, list[str]] = {}
    for w in gap.workers:
        entry = advertised(w, gap.stage)
        config = w.get("config")
        where = f"{w.get('hostname', '?')}" + (f" from {config}" if config else "")
        groups.setdefault(label(entry, gap.run), []).append(where)
    theirs = " and ".join(f"{text} (workers {', '.join(names)})" for text, names in groups.items())
    against = advertised(gap.workers[0], gap.stage) if len(groups) == 1 else None
    return f"{gap.stage}: {label(gap.run, against)} (run) vs {theirs}"


def start_command(
    queue: str, config: str | None, env: Mapping[str, str], name: str, redis_url: str | None = None
) -> str:
    """The command that starts a worker of ``queue`` with the run's settings (``config``, its file, and ``env``)
    on the run's Redis (``redis_url``, written as given: pass it with its password redacted; None: left out)."""
    prefix = [f"{CONFIG_ENV}={config}"] if config else ["-u", CONFIG_ENV]
    if redis_url:
        prefix += [f"REDIS_URL={redis_url}"]
    prefix += [f"{k}={v}" for k, v in sorted(env.items())]
    argv = ["celery", "-A", "tasks", "worker", "-Q", queue, "-n", f"{name}@%h"]
    if queue.startswith("gpu"):
        argv[6:6] = ["-P", "solo", "-c", "1"]
    return "env " + " ".join(shlex.quote(p) for p in prefix) + " " + " ".join(argv)


def queue_of(gap: Unserved, cpu_queue: str) -> str:
    """The queue a worker serving ``gap``'s stage consumes: the hosting workers' GPU queue, else ``cpu_queue``."""
    for w in gap.workers:
        for queue in w.get("gpu_queues", []):
            own = queue.partition(".")[2]
            if not own or own == gap.stage:
                return str(queue)
    return cpu_queue


def explain(
    gaps: list[Unserved],
    config: str | None,
    env: Mapping[str, str],
    cpu_queue: str,
    tag: str,
    redis_url: str | None = None,
) -> list[str]:
    """One line per stage that differs, then the commands that start workers with the run's settings.

    ``config``: the run's settings file (None: none, the defaults); ``env``: the stage-deciding environment
    variables it was enqueued with; ``tag``: a few characters of the run's settings hash, naming the workers.
    """
    lines = [describe(gap) for gap in gaps]
    queues = list(dict.fromkeys(queue_of(gap, cpu_queue) for gap in gaps))
    commands = [start_command(q, config, env, f"{q.replace('.', '-')}-{tag}", redis_url) for q in queues]
    setting = f"{CONFIG_ENV}={config}" if config else f"no {CONFIG_ENV}"
    lines.append(f"start workers with the run's settings ({setting}): " + "; ".join(f"`{c}`" for c in commands))
    return lines

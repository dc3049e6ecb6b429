"""The Redis that holds a run of an output folder, found from the folder itself, and whether it knows the run.

A command given OUT (`cancel`, `status`, `report`, a `--continue`) talks to: $REDIS_URL (or
$FRAMEFLEET_REDIS_URL) when one is set; else the private Redis of the `framefleet run` that started the
run, whose address and password that run keeps in OUT/logs/redis-auth.txt (mode 0600) while it lasts;
else the settings' redis_url. Whichever it is, a run it does not know is not that Redis's to act on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tasks.run import runs
from worker_config.settings import redact_url

GIVEN = ("REDIS_URL", "FRAMEFLEET_REDIS_URL")  # a Redis named on purpose wins over the folder's
FILE_NAME = "redis-auth.txt"  # in OUT/logs/ (tasks.cli.local_auth): redis://:<password>@127.0.0.1:<port>/0


def kept_path(out: Path) -> Path:
    return out / "logs" / FILE_NAME


def kept(out: Path) -> str | None:
    """The URL of the private Redis a `framefleet run` of ``out`` keeps there, or None."""
    try:
        url = kept_path(out).read_text().strip()
    except OSError:
        return None
    return url or None


def given() -> str | None:
    """The environment variable that names a Redis on purpose, or None."""
    return next((name for name in GIVEN if os.environ.get(name)), None)


@dataclass(frozen=True)
class Choice:
    """A run's Redis: its URL (None: the settings' redis_url) and where it came from, in words."""

    url: str | None
    source: str


def choose(out: Path, record: dict[str, Any] | None) -> Choice:
    """The Redis to reach ``record``'s run (OUT's newest when None) through: see the module's rule.

    OUT's kept address counts only for a run made on it (the record names its Redis, redacted; a record of
    an older version names none)."""
    if (name := given()) is not None:
        return Choice(None, f"${name}")
    url = kept(out)
    ran_on = (record or {}).get("redis")
    if url is not None and ran_on in (None, redact_url(url)):
        return Choice(url, f"{kept_path(out)}, the private Redis of the `framefleet run` that started it")
    return Choice(None, "the settings' redis_url")


def unknown_run(client: redis.Redis, url: str, choice: Choice, record: dict[str, Any], out: Path) -> str | None:
    """Why ``client`` (at ``url``) is not the Redis of ``record``'s run, with the fix; None when it is."""
    run_id = record["run_id"]
    try:
        if runs.lookup(client, run_id) is not None:
            return None
    except redis.RedisError as exc:
        why = f"cannot reach run {run_id}'s Redis at {redact_url(url)} (from {choice.source}): "
        why += f"{type(exc).__name__}: {exc}"
        if choice.url is not None:
            return why + "; the `framefleet run` that started the run has ended, and its private Redis with it"
        return why + "; start that Redis, or point REDIS_URL at the one the run was enqueued on"
    where = f"the Redis at {redact_url(url)} (from {choice.source}) does not know run {run_id} of {out}"
    if choice.url is None and kept(out) is not None and given() is not None:
        return f"{where}; its own Redis is kept in {kept_path(out)}: run the command without ${given()}"
    if record.get("redis"):
        return f"{where}; the run was enqueued on Redis {record['redis']}: point REDIS_URL at that one"
    return f"{where}; point REDIS_URL at the Redis the run was enqueued on"

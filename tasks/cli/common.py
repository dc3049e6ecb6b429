"""What every framefleet script shares: import path, --config, settings errors as clean exits."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import redis

from tasks import redis_refusal
from worker_config.settings import (
    CONFIG_ENV,
    ConfigError,
    Settings,
    exit_on_config_error,
    load_settings,
    redact_url,
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and appends each option's default to its help, when it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS, [])
        if shown and "default" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help=f"YAML settings file (else ${CONFIG_ENV})")


def settings_from(args: argparse.Namespace, celery: bool = True) -> Settings:
    """Load the settings named by --config and, with ``celery``, apply them to the Celery app (which that
    loads: a command that reads only Redis passes False); exit 2 with the reason when they are bad."""
    try:
        conf = load_settings(args.config)
    except ConfigError as exc:
        exit_on_config_error(exc)
    if args.config:
        # Child processes (workers, Flower) read the same file.
        os.environ[CONFIG_ENV] = str(Path(args.config).resolve())
    if celery:
        from tasks import configure

        configure(conf)
    return conf


def print_backends(conf: Settings) -> None:
    """Say on stderr, before anything runs, which backend each model stage uses and what it is not (stdout's
    first line stays the run's)."""
    from tasks.backends.defaults import describe
    from tasks.stages import model_backends

    print("backends (what makes the data):", file=sys.stderr, flush=True)
    for line in describe(model_backends(conf)):
        print(f"  {line}", file=sys.stderr, flush=True)


def printable(value: object) -> str:
    """``value`` as text for a terminal: each control character (ESC, newline, NUL…) written as its escape
    (``\\x1b``, ``\\n``), so that a file name cannot move the cursor, recolour or forge a line."""
    text = str(value)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def plural(n: int, noun: str) -> str:
    """``1 video``, ``2 videos``: a count with its noun."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def positive_int(text: str) -> int:
    """An argparse type for counts that must be at least 1 (``--limit``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value} (leave the option out for every video)")
    return value


# Exit statuses of framefleet's commands: 0 done, 1 a video failed (or `verify` found a problem), 2 a usage,
# settings or folder error, 3 the run lost from Redis, 4 cancelled, 5 Redis refused writes (full, read-only),
# 130 interrupted.
REDIS_REFUSED = redis_refusal.EXIT_STATUS


def stop_if_redis_refused(exc: BaseException, raw_dir: Path, out: Path) -> int:
    """Print why Redis refused a write (full, read-only, MISCONF), its fix and how to finish the run; return
    exit status 5. Re-raises ``exc`` when it is no such refusal."""
    why = redis_refusal.refusal(exc)
    if why is None:
        raise exc
    return redis_refused(why, raw_dir, out)


def redis_refused(why: str, raw_dir: Path, out: Path) -> int:
    """Print ``why`` (``tasks.redis_refusal``), that nothing sent is lost and how to finish the run; return 5."""
    return fail(
        f"{why}. Nothing sent is lost: what was sent waits in Redis and complete outputs stay in {out}; once "
        f"Redis takes writes again, `framefleet enqueue {raw_dir} --out {out} --continue` finishes the run",
        code=REDIS_REFUSED,
    )


def fail(message: str, code: int = 2) -> int:
    print(f"framefleet: {message}", file=sys.stderr)
    return code


def parse_gpus(text: str | None) -> list[int] | None:
    """An argparse type for ``--gpus``: ``0,2`` gives [0, 2]; ``all`` (or nothing) gives None."""
    if not text or text == "all":
        return None
    try:
        gpus = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus takes GPU indices like 0,2 or 'all', not {text!r}") from None
    return gpus or None


def check_redis(conf: Settings) -> str | None:
    """Return why Redis cannot be reached (with how to fix it), or None when it answers."""
    from tasks.redis_client import get_redis

    try:
        get_redis(conf.redis_url).ping()
        return None
    except redis.RedisError as exc:
        return (
            f"cannot reach Redis at {redact_url(conf.redis_url)} ({exc}). Start one "
            "(`redis-server --port 6379 --daemonize yes`), or point REDIS_URL (or redis_url in "
            "--config) at the Redis your workers use; `framefleet run` starts its own"
        )

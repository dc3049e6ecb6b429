"""What every framefleet script shares: import path, --config, settings errors as clean exits."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from worker_config.settings import CONFIG_ENV, ConfigError, Settings, exit_on_config_error, load_settings


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help=f"YAML settings file (else ${CONFIG_ENV})")


def settings_from(args: argparse.Namespace) -> Settings:
    """Load and apply the settings named by --config; exit 2 with the reason when they are bad."""
    try:
        conf = load_settings(args.config)
    except ConfigError as exc:
        exit_on_config_error(exc)
    if args.config:
        # Child processes (workers, Flower) read the same file.
        os.environ[CONFIG_ENV] = str(Path(args.config).resolve())
    from tasks import configure

    configure(conf)
    return conf


def parse_gpus(text: str | None) -> list[int] | None:
    """The GPU indices of a --gpus value such as "0,2" (None for "all" or nothing). Raises ArgumentTypeError."""
    if not text or text == "all":
        return None
    try:
        gpus = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus takes GPU indices like 0,2 or 'all', not {text!r}") from None
    return gpus or None


def fail(message: str, code: int = 2) -> int:
    print(f"framefleet: {message}", file=sys.stderr)
    return code

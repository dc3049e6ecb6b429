"""What the adapters of the upstream models share at load time: checking paths, importing, a checkout's cwd.

Every check raises ModelLoadError naming what is missing, where it was looked for, and
the command that provides it, so that the worker's fatal start-up message says the fix.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from tasks.errors import ModelLoadError


def need_dir(path: str | os.PathLike[str] | None, what: str, setting: str, fix: str) -> Path:
    """Return ``path`` as a Path if it is a directory; raise ModelLoadError naming ``what``, ``setting`` and ``fix``."""
    if not path:
        raise ModelLoadError(f"{what}: no folder given; set {setting}. {fix}")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"{what}: {folder} is not a folder (set by {setting}). {fix}")
    return folder


def need_file(path: Path, what: str, fix: str) -> Path:
    """Return ``path`` if it is a file; raise ModelLoadError naming ``what``, the path and ``fix``."""
    if not path.is_file():
        raise ModelLoadError(f"{what} is missing: {path} does not exist. {fix}")
    return path


def need_module(name: str, what: str, install: str) -> ModuleType:
    """Import module ``name``; raise ModelLoadError naming ``what`` and the ``install`` command when it is absent."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelLoadError(
            f"{what}: the Python module {name!r} cannot be imported in {sys.executable} ({exc}). "
            f"Install it into this stage's environment: {install}"
        ) from exc


@contextlib.contextmanager
def inside(repo_dir: Path) -> Iterator[None]:
    """Run the block in ``repo_dir`` (upstream code reads relative paths); it stays first on sys.path after."""
    before = os.getcwd()
    if str(repo_dir) not in sys.path:
        # Kept after the block: upstream modules import their siblings lazily, per call.
        sys.path.insert(0, str(repo_dir))
    os.chdir(repo_dir)
    try:
        yield
    finally:
        os.chdir(before)

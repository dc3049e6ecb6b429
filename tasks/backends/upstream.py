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
from typing import Any
from urllib.parse import urlparse

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


def inside_folder(folder: Path, name: str | os.PathLike[str], setting: str, where: str = "") -> Path:
    """``folder / name`` when ``name`` is a path relative to ``folder`` that stays in it; raise ModelLoadError
    naming ``setting`` and the folder (``where``: how to name it, default "the weights folder FOLDER") otherwise.

    A checkpoint or model folder is a file of this host's weights folder, never a path from elsewhere: upstream
    loaders unpickle what they are given (``torch.load(weights_only=False)``), so a file outside it could run
    code as the worker's user. The check is on the name as written; a link the host put in ``folder`` is its own.
    """
    given = Path(name)
    if given.is_absolute() or ".." in given.parts or not given.parts:
        raise ModelLoadError(
            f"{setting} = {os.fspath(name)!r} must name a file inside {where or f'the weights folder {folder}'} (a "
            f"path relative to it, without '..'): put the file there and set {setting} to its name"
        )
    return folder / given


def need_module(name: str, what: str, install: str) -> ModuleType:
    """Import module ``name``; raise ModelLoadError naming ``what`` and the ``install`` command if its import fails."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # an import can fail in any way: pyglet's X11 loader raises AttributeError
        raise ModelLoadError(
            f"{what}: the Python module {name!r} cannot be imported in {sys.executable} ({type(exc).__name__}: {exc}). "
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


def _hub_downloads_refused(hub: Any) -> dict[str, Any]:
    """Return replacements for torch hub's downloaders that use the cache or raise ModelLoadError naming the file."""
    original_from_url, original_load = hub.load_state_dict_from_url, hub.load

    def load_state_dict_from_url(url: str, model_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
        folder = Path(model_dir) if model_dir else Path(hub.get_dir()) / "checkpoints"
        name = kwargs.get("file_name") or os.path.basename(urlparse(url).path)
        if not (folder / name).is_file():
            raise ModelLoadError(f"{folder / name} is missing, and a worker never downloads: put {url} there")
        return original_from_url(url, model_dir, *args, **kwargs)

    def download_url_to_file(url: str, dst: str, *args: Any, **kwargs: Any) -> None:
        raise ModelLoadError(f"{dst} is missing, and a worker never downloads: put {url} there")

    def load(repo_or_dir: str, model: str, *args: Any, source: str = "github", **kwargs: Any) -> Any:
        if source == "local":
            return original_load(repo_or_dir, model, *args, source=source, **kwargs)
        owner_name, _, ref = str(repo_or_dir).partition(":")
        folders = [
            Path(hub.get_dir()) / f"{owner_name.replace('/', '_')}_{r}" for r in ([ref] if ref else ["main", "master"])
        ]
        for folder in folders:
            if folder.is_dir():  # torch hub's own cache of the repository: load it from there, offline
                kwargs.pop("trust_repo", None)
                kwargs.pop("skip_validation", None)
                return original_load(str(folder), model, *args, source="local", **kwargs)
        raise ModelLoadError(
            f"torch.hub.load({repo_or_dir!r}, {model!r}) needs the repository in {folders[0]}, and a worker never "
            "downloads: fill torch hub's cache on a machine with network access, or use a config that does not "
            "load it"
        )

    return {
        "load_state_dict_from_url": load_state_dict_from_url,
        "download_url_to_file": download_url_to_file,
        "load": load,
    }


def _gdown_refused() -> Any:
    def download(url: str | None = None, output: str | None = None, *args: Any, **kwargs: Any) -> str:
        if output and Path(output).is_file():
            return output
        raise ModelLoadError(f"{output} is missing, and a worker never downloads: put {url} there")

    return download


@contextlib.contextmanager
def no_downloads() -> Iterator[None]:
    """Within the block, torch hub, gdown and the Hugging Face hub use their caches only: a missing file raises.

    The error (ModelLoadError) names the file and where it comes from, so a worker stops at
    start-up instead of trying the network (or hanging on it). ``HF_HUB_OFFLINE`` is set for
    the process (huggingface_hub reads it when first imported).
    """
    import torch.hub as hub

    os.environ["HF_HUB_OFFLINE"] = "1"
    saved: list[tuple[Any, str, Any]] = []
    patches: list[tuple[Any, str, Any]] = [(hub, k, v) for k, v in _hub_downloads_refused(hub).items()]
    try:
        import gdown  # type: ignore[import-not-found]

        patches.append((gdown, "download", _gdown_refused()))
    except ImportError:
        pass
    for module, name, value in patches:
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)

"""What made an output: framefleet's version, each stage's backend, its version or commit, weights hash and
resolved settings, the source video's path, size and hash, the run and the time.

Each stage's intermediate carries the record of every stage before it (the ``framefleet_meta``
entry of its npz, a JSON string), so the dataset stage holds the whole chain, whichever
workers and hosts ran it, and writes it into the HDF5 file's attributes (``write_attrs``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import time
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tasks.job import Job
from tasks.outputs.provenance_file import (  # noqa: F401  (what readers of a file's record use)
    ATTR,
    QUALITY_ATTR,
    decode,
    encode,
    read_attrs,
    summary,
    with_changes,
    write_attrs,
)
from worker_config.settings import Settings, resolved_stage

META_KEY = "framefleet_meta"
CHECKOUT = Path(__file__).resolve().parents[2]  # the repository, when framefleet runs from one


def git_commit(folder: str | os.PathLike[str]) -> str | None:
    """The commit checked out in ``folder`` (a git checkout), or None when it is not one."""
    state = git_state(folder)
    return state[0] if state else None


def git_state(folder: str | os.PathLike[str]) -> tuple[str, int] | None:
    """The commit checked out in ``folder`` and how many tracked files differ from it (edited, added or
    removed, staged or not; untracked files aside), or None when it is not a checkout. A tree copied with
    its ``.git`` (a GPU host given a working copy) names its commit and says it was changed."""
    if not (Path(folder) / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
        changed = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return (commit, len(changed.stdout.splitlines())) if commit else None


@cache
def framefleet_version() -> dict[str, Any]:
    """framefleet's package version, and when it runs from a git checkout its commit and (if any) how many
    tracked files differ from it (``modified_files``): outputs of an edited tree do not pass for the commit's."""
    try:
        found: dict[str, Any] = {"version": version("framefleet")}
    except PackageNotFoundError:
        found = {"version": "unknown"}
    state = git_state(CHECKOUT)
    if state:
        found["commit"] = state[0]
        if state[1]:
            found["modified_files"] = state[1]
    return found


def package_version(*names: str) -> str | None:
    """The installed version of the first distribution of ``names`` that is installed, as ``name==version``."""
    for name in names:
        try:
            return f"{name}=={version(name)}"
        except PackageNotFoundError:
            continue
    return None


_HASHED: dict[tuple[str, int, int], str] = {}


def hash_file(path: Path) -> str:
    """sha256 of ``path``, remembered per (path, size, mtime) for the life of the process."""
    from tasks.outputs.storage import sha256_file

    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(path)
    return _HASHED[key]


def hash_tree(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """One sha256 over every file under ``folder`` (relative path and content hash, in path order)."""
    root = Path(folder).expanduser()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    digest = hashlib.sha256()
    total = 0
    for path in files:
        digest.update(f"{path.relative_to(root).as_posix()}\0{hash_file(path)}\n".encode())
        total += path.stat().st_size
    return {"path": str(root), "files": len(files), "bytes": total, "sha256": digest.hexdigest()}


def backend_identity(model: Any) -> dict[str, Any]:
    """What pins a backend's outputs: its package version, the upstream checkout's commit, its weights' hash.

    Worked out once per loaded model (the weights are hashed on its first video, then remembered).
    """
    known = getattr(model, "_framefleet_identity", None)
    if known is None:
        known = _identity(model)
        with contextlib.suppress(AttributeError):  # a backend class with __slots__: worked out each time
            model._framefleet_identity = known
    return dict(known)


def _identity(model: Any) -> dict[str, Any]:
    packages = getattr(model, "packages", ())
    found: dict[str, Any] = {"package": package_version(*packages) if packages else None}
    if found["package"] is None:
        found["package"] = f"framefleet=={framefleet_version()['version']}"
    repo = getattr(model, "repo_dir", None)
    if repo and (state := git_state(Path(repo).expanduser())):
        found["upstream_commit"] = state[0]
        if state[1]:
            found["upstream_modified_files"] = state[1]
    weights = getattr(model, "weights_dir", None)
    if weights and Path(weights).expanduser().is_dir():
        found["weights"] = hash_tree(weights)
    return found


def stage_record(stage_name: str, stage: Any, conf: Settings) -> dict[str, Any]:
    """The provenance of one stage as this worker runs it: backend, identity, resolved settings and their hash."""
    from tasks.backends.defaults import what

    settings, digest = resolved_stage(conf, stage_name)
    record: dict[str, Any] = {"backend": settings["backend"], "settings": settings, "settings_sha256": digest}
    model = getattr(stage, "model", None)
    if model is not None:
        record["what"] = what(stage_name, settings["backend"])
        record.update(backend_identity(model))
    record["made"] = time.time()
    return record


def source_record(job: Job) -> dict[str, Any]:
    """The source video: its path relative to RAW_DIR, size in bytes and sha256."""
    path = Path(job.dataset_root) / job.video
    return {"path": job.video, "bytes": path.stat().st_size, "sha256": hash_file(path)}


def merge(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from the records of the outputs a stage reads (each holds the stages before it)."""
    merged: dict[str, Any] = {"stages": {}, "quality": {}}
    for meta in metas:
        merged["stages"].update(meta.get("stages", {}))
        merged["quality"].update(meta.get("quality", {}))
        if "source" in meta:
            merged["source"] = meta["source"]
    return merged


def begin(stage_name: str, stage: Any, job: Job, conf: Settings, upstream: dict[str, Any] | None) -> dict[str, Any]:
    """The record of an output about to be made: the stages before it, this stage, the source, the run."""
    from tasks.stages import source_stage

    meta = merge([upstream or {}])
    meta["stages"][stage_name] = stage_record(stage_name, stage, conf)
    if stage_name == source_stage().name or "source" not in meta:
        meta["source"] = source_record(job)
    meta["framefleet"] = framefleet_version()
    meta["run_id"] = job.run_id
    return meta


def finish(meta: dict[str, Any], stage_name: str, quality: dict[str, Any] | None) -> dict[str, Any]:
    """Add this stage's measured quality to ``meta``; return the quality of every stage so far."""
    if quality:
        meta["quality"][stage_name] = quality
    return meta["quality"]

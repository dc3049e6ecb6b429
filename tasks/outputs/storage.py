"""Exactly-once outputs: atomic writes, completion markers holding content hashes, root confinement."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import PathOutsideRoot
from tasks.outputs import remote

MARKER_SUFFIX = ".done.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], Any], fence: Callable[[], None] | None = None) -> str:
    """Write ``path`` through ``write(tmp)`` to a temporary name, fsync, rename; return its sha256.

    ``fence``, if given, is called just before the rename; whatever it raises discards the new file. In an
    object-store root's folder the file is uploaded between the fence and the rename (tasks.outputs.remote).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        digest = sha256_file(tmp)
        if fence is not None:
            fence()
        remote.publish(tmp, path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return digest


def clear_temporaries(path: Path) -> int:
    """Remove the temporary files a writer of ``path`` left when it died mid-write; return how many.

    Call it only while holding the claim on ``path``'s stage: no other writer is then legitimate.
    """
    stale = list(path.parent.glob(f".{path.name}.*.tmp")) if path.parent.is_dir() else []
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return len(stale)


def write_text_atomic(path: Path, text: str, fence: Callable[[], None] | None = None) -> str:
    return atomic_write(path, lambda tmp: tmp.write_text(text), fence)


def save_npz(path: Path, arrays: dict[str, Any], fence: Callable[[], None] | None = None) -> str:
    """Save ``arrays`` (numeric only, no pickle) atomically; return the file's sha256."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{key: np.asarray(value) for key, value in arrays.items()})  # type: ignore[arg-type]

    return atomic_write(path, write, fence)


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def marker_path(output: Path) -> Path:
    return output.with_name(output.name + MARKER_SUFFIX)


def write_marker(
    output: Path, digest: str, marker: Path | None = None, fence: Callable[[], None] | None = None, **extra: Any
) -> None:
    """Record that ``output`` is complete, with its hash, size, modification time and any small extra data
    (``fence``: as atomic_write)."""
    st = output.stat()
    record = {"file": output.name, "sha256": digest, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, **extra}
    write_text_atomic(marker or marker_path(output), json.dumps(record, sort_keys=True), fence)


IF_TOUCHED = "if_touched"


def read_marker(output: Path, marker: Path | None = None, check_hash: bool | str = True) -> dict | None:
    """Return the marker of a complete, unaltered ``output``, or None when it must be (re)done.

    ``check_hash``: True hashes the file; False trusts its size; IF_TOUCHED hashes it only when
    its modification time is not the one the marker recorded (an edit that kept the size, a
    copy), so checking 50,000 untouched files costs 50,000 stat calls, not reading terabytes.
    """
    marker = marker or marker_path(output)
    try:
        remote.refresh(marker)  # in an object-store root's folder, the bucket's; nothing for a local folder
        remote.refresh(output)
        record = json.loads(marker.read_text())
        st = output.lstat()  # a link in place of an output is not an output
        if not stat.S_ISREG(st.st_mode) or st.st_size != record["bytes"]:
            return None
        touched = record.get("mtime_ns") != st.st_mtime_ns
        if (check_hash is True or (check_hash == IF_TOUCHED and touched)) and sha256_file(output) != record["sha256"]:
            return None
        return record
    except (OSError, ValueError, KeyError):
        return None


def confine(root: Path, relative: str | os.PathLike[str]) -> Path:
    """Resolve ``relative`` under ``root``; raise PathOutsideRoot unless it lies strictly inside root.

    The root itself is refused as well as anything beyond it (or a link leading there): a path a
    message names is something to read, write or delete below its root, never the root.
    """
    base = Path(root).resolve()
    if "\x00" in os.fspath(relative):
        raise PathOutsideRoot(
            f"{os.fspath(relative)!r} holds a NUL byte; messages carry plain paths relative to {base}"
        )
    candidate = Path(relative)
    if candidate.is_absolute():
        raise PathOutsideRoot(f"{relative!s} is an absolute path; messages carry paths relative to {base}")
    resolved = (base / candidate).resolve()
    if base not in resolved.parents:
        what = "is the root itself" if resolved == base else "leaves the root"
        raise PathOutsideRoot(f"{os.fspath(relative)!r} {what} {base}; refused without reading it")
    return resolved


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` lies strictly inside ``folder`` (both resolved: a link counts where it leads)."""
    return Path(folder).resolve() in Path(path).resolve().parents

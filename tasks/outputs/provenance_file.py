"""A dataset file's provenance record on disk: encoded for npz intermediates, and as HDF5 attributes.

What the record holds is assembled by tasks.outputs.provenance; this module only writes and reads it,
so that the stage writing the HDF5 file needs nothing of the settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import numpy as np

ATTR = "framefleet_provenance"  # the whole record, JSON, on the HDF5 file's root (not under root/)
QUALITY_ATTR = "framefleet_quality"


def encode(meta: dict[str, Any]) -> np.ndarray:
    """``meta`` as an npz entry: a 0-d unicode array (no pickle)."""
    return np.array(json.dumps(meta, sort_keys=True, default=str))


def decode(value: Any) -> dict[str, Any]:
    return dict(json.loads(str(np.asarray(value).item())))


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    """The short form for markers, the manifest and the statistics: framefleet, backends, settings hash, source."""
    stages = meta.get("stages", {})
    whole = hashlib.sha256(
        json.dumps({n: s.get("settings_sha256") for n, s in stages.items()}, sort_keys=True).encode()
    ).hexdigest()
    return {
        "framefleet": meta.get("framefleet", {}),
        "backends": {n: s["backend"] for n, s in stages.items()},
        "versions": {n: _version(s) for n, s in stages.items() if "package" in s},
        "settings_sha256": whole,
        "source": meta.get("source", {}),
        "run_id": meta.get("run_id"),
    }


def with_changes(commit: str, modified: int, length: int | None = 12) -> str:
    """A commit as provenance shows it (its first ``length`` characters; None: whole), and how many tracked files
    of its checkout differed from it."""
    return commit[:length] + (f", {modified} tracked file(s) changed" if modified else "")


def _version(stage: dict[str, Any]) -> str | None:
    """A stage's upstream commit (with how many of its tracked files were changed, if any), else its package."""
    if commit := stage.get("upstream_commit"):
        return with_changes(commit, stage.get("upstream_modified_files", 0), None)
    return stage.get("package")


def write_attrs(f: Any, meta: dict[str, Any]) -> None:
    """Write ``meta`` as attributes of the open h5py file ``f``'s root: the whole JSON and the main facts flat."""
    short = summary(meta)
    f.attrs[ATTR] = json.dumps(meta, sort_keys=True, default=str)
    f.attrs[QUALITY_ATTR] = json.dumps(meta.get("quality", {}), sort_keys=True)
    flat: dict[str, Any] = {
        "framefleet_version": short["framefleet"].get("version", ""),
        "framefleet_commit": short["framefleet"].get("commit", ""),
        "framefleet_modified_files": int(short["framefleet"].get("modified_files", 0)),
        "run_id": short["run_id"] or "",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings_sha256": short["settings_sha256"],
        "source_path": short["source"].get("path", ""),
        "source_bytes": int(short["source"].get("bytes", 0)),
        "source_sha256": short["source"].get("sha256", ""),
    }
    flat.update({f"backend_{stage}": name for stage, name in short["backends"].items()})
    for key, value in flat.items():
        f.attrs[key] = value


def read_attrs(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The provenance record of an HDF5 file (with its quality), or None for a file written without one."""
    import h5py

    with h5py.File(path, "r") as f:
        if ATTR not in f.attrs:
            return None
        meta = json.loads(str(f.attrs[ATTR]))
        meta["created"] = str(f.attrs.get("created", ""))
        return dict(meta)

"""The upstream models' source snapshots (../shared/upstream), unpacked once into a cache folder, and a runner.

Each archive ``<owner>+<repo>.tar.gz`` unpacks to a folder of that name holding the
repository as it is upstream (its ``.upstream-commit`` names the commit). The tests never
copy upstream code into this repository: they unpack it under the temp folder, keyed by
the archive's hash, and run our adapters with that folder on the interpreter's path, as a
worker runs them from an environment where ``deploy/envs/build.sh`` installed the same code.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def upstream_dir() -> Path:
    """Return the folder of the archives: $FRAMEFLEET_UPSTREAM_SRC, else shared/upstream beside the repository."""
    candidates = [Path(os.environ["FRAMEFLEET_UPSTREAM_SRC"])] if os.environ.get("FRAMEFLEET_UPSTREAM_SRC") else []
    candidates += [parent / "shared" / "upstream" for parent in ROOT.parents[:3]]
    for path in candidates:
        if (path / "facebookresearch+co-tracker.tar.gz").is_file():
            return path
    raise FileNotFoundError(
        f"the upstream source snapshots (facebookresearch+co-tracker.tar.gz, ...) are not in any of "
        f"{[str(c) for c in candidates]}; set FRAMEFLEET_UPSTREAM_SRC to their folder"
    )


def source(name: str) -> Path:
    """Return the unpacked source of archive ``name`` (e.g. "facebookresearch+co-tracker"), unpacking it once."""
    archive = upstream_dir() / f"{name}.tar.gz"
    if not archive.is_file():
        raise FileNotFoundError(f"{archive} is missing; the upstream sources' README lists the archives")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("FRAMEFLEET_UPSTREAM_CACHE", Path(tempfile.gettempdir()) / "framefleet-upstream"))
    folder = cache / f"{name}-{digest}"
    if (folder / ".ready").exists():
        return folder / name
    cache.mkdir(parents=True, exist_ok=True)
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".ready").exists():
            shutil.rmtree(folder, ignore_errors=True)
            with tarfile.open(archive) as tar:
                tar.extractall(folder, filter="data")
            (folder / ".ready").touch()
    return folder / name


def run_python(code: str, *args: str, path: list[Path], timeout_s: float = 900, env: dict[str, str] | None = None):
    """Run ``code`` in a fresh interpreter of this venv with the project and ``path`` first; return its last JSON line.

    The network stays off for model hubs (HF_HUB_OFFLINE), as on a worker.
    """
    run_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), *map(str, path)]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
        **(env or {}),
    }
    run = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=run_env,
    )
    if run.returncode != 0:
        raise AssertionError(f"the upstream run failed ({run.returncode}):\n{run.stdout[-4000:]}\n{run.stderr[-8000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])

"""A stage in its own Python environment: tasks on gpuN.<stage>, run by a worker started from that interpreter."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ONE_WORKER_EACH, ROOT, run_script, settings_env

PACKAGE = ROOT / "tests" / "envonly_backend"


def _source_hash() -> str:
    digest = hashlib.sha256(sys.executable.encode())
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(PACKAGE).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def stage_env() -> Path:
    """A second venv holding the project's dependencies and a backend the main env lacks; cached between runs.

    It sees the main environment's packages through a .pth file (as a venv made with the
    project's requirements would have them) and gets ``framefleet-envonly`` installed by pip,
    into its own site-packages only.
    """
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "framefleet-tests"
    env = cache / f"stage-env-{_source_hash()}"
    if (env / "bin" / "python").exists():
        return env
    cache.mkdir(parents=True, exist_ok=True)
    # Two test sessions on one machine build it once: the second waits for the first, then uses its venv.
    with open(cache / f"stage-env-{_source_hash()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (env / "bin" / "python").exists():
            _build(env, cache)
    return env


def _build(env: Path, cache: Path) -> None:
    """Build the stage venv in a folder of this process, then move it to ``env`` in one rename."""
    building = cache / f"building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True)
    purelib = sysconfig.get_paths()["purelib"]
    site = Path(
        subprocess.run(
            [str(building / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "_framefleet_main_env.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    build_dir = cache / f"pkg-{os.getpid()}"
    shutil.rmtree(build_dir, ignore_errors=True)
    shutil.copytree(PACKAGE, build_dir, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    subprocess.run(
        [
            str(building / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            str(build_dir),
        ],
        check=True,
        cwd=cache,
    )
    shutil.rmtree(build_dir, ignore_errors=True)
    # venv scripts name their own folder: keep the interpreter path valid after the rename
    try:
        building.rename(env)
    except OSError:
        if not (env / "bin" / "python").exists():
            raise
        shutil.rmtree(building, ignore_errors=True)  # a session of an older checkout, without the lock, won


def test_a_stage_with_its_own_python_runs_from_that_environment(video_factory, pipeline_env, tmp_path):
    env_dir = stage_env()
    python = str(env_dir / "bin" / "python")
    main_has_it = subprocess.run([sys.executable, "-c", "import framefleet_envonly"], capture_output=True)
    assert main_has_it.returncode != 0, "the backend must exist only in the stage's environment"

    raw, out = video_factory(3), tmp_path / "out"
    env = {k: v for k, v in pipeline_env.items() if k != "REDIS_URL"}
    env.update(settings_env(tmp_path, f"stages:\n  hands:\n    backend: envonly\n    python: {python}\n"))
    done = run_script("run_local.py", str(raw), "--out", str(out), *ONE_WORKER_EACH, env=env)
    assert done.returncode == 0, done.stdout + done.stderr

    logs = out / "logs"
    hands_log = "".join(f.read_text() for f in logs.glob("gpu0.hands-*.log"))
    main_log = "".join(f.read_text() for f in logs.glob("gpu0-*.log"))
    assert hands_log.count("ran hands of") == 3 and f"envonly hands ran in {env_dir}" in hands_log
    assert "ran hands of" not in main_log and main_log.count("ran depth of") == 3
    verified = run_script("verify_dataset.py", str(out), env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    hands_workers = summary["stages"]["hands"]["workers"]
    assert summary["done"] == 3 and sum(hands_workers.values()) == 3
    assert all(name.startswith("gpu0.hands-") for name in hands_workers), hands_workers


def test_a_worker_refuses_a_stage_queue_it_cannot_host(pipeline_env, tmp_path):
    # hands has no python of its own here, so gpu0.hands is nobody's queue
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "gpu0.hands", "-P", "solo"],
        cwd=ROOT,
        env=pipeline_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "stages.hands.python is not set" in done.stderr + done.stdout


@pytest.mark.parametrize("queue", ["gpu0.preprocess", "gpu0.nosuch"])
def test_a_worker_refuses_a_queue_of_a_non_gpu_stage(pipeline_env, queue):
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", queue, "-P", "solo"],
        cwd=ROOT,
        env=pipeline_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "which is not a GPU stage" in done.stderr + done.stdout

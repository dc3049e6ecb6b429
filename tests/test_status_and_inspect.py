"""`celery -A tasks inspect gpu` against a real idle worker; scripts/status.py with a real busy worker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tasks.gpu import NoGpuProbe
from tasks.gpu.fake import FakeGpuLedger
from tests.conftest import ROOT, run_script, settings_env, wait_until

# A safety net, not a speed check: real workers start and run here, slowly on a loaded machine.
pytestmark = pytest.mark.timeout(240)

TWO_GPUS = [
    {"total_mib": 16384, "name": "Fake GPU 16GB", "utilization_pct": 5},
    {"total_mib": 24576, "name": "Fake GPU 24GB", "utilization_pct": 12},
]


def test_inspect_gpu_answers_with_the_worker_state_and_its_own_gpu(workers, pipeline_env, tmp_path):
    ledger = FakeGpuLedger.create(tmp_path / "gpu.json", TWO_GPUS)
    env = settings_env(tmp_path, "stages:\n  depth: {params: {hold_mib: 2000}}\n", FRAMEFLEET_FAKE_GPU=str(ledger.path))
    workers.start("gpu1", env=env)
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "inspect", "gpu", "-t", "10", "-d", "gpu1@test"]
    done = subprocess.run(
        [*argv, "--json"], cwd=ROOT, env={**pipeline_env, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)["gpu1@test"]
    assert reply["probe"] == "fake"
    assert reply["worker"]["hostname"] == "gpu1@test" and reply["worker"]["queues"] == ["gpu1"]
    assert reply["worker"]["busy"] is False and reply["worker"]["stages"] == ["depth", "tracks", "hands"]
    assert reply["gpu"]["index"] == 1 and reply["gpu"]["name"] == "Fake GPU 24GB"  # its own GPU, not GPU 0
    assert reply["gpu"]["total_mib"] == 24576 and reply["gpu"]["used_mib"] == 2000
    assert reply["process_used_mib"] == 2000
    human = subprocess.run(argv, cwd=ROOT, env={**pipeline_env, **env}, capture_output=True, text=True, timeout=60)
    assert human.returncode == 0 and "gpu1@test: OK" in human.stdout and "1 node online" in human.stdout


def test_status_shows_gpus_workers_queues_the_run_and_the_quarantine(
    workers, pipeline_env, video_factory, tmp_path, monkeypatch
):
    ledger = FakeGpuLedger.create(tmp_path / "gpu.json", TWO_GPUS[1:])
    env = settings_env(
        tmp_path,
        "stages:\n  depth: {params: {hold_mib: 3072, seconds_per_frame: 2.0}}\n",
        FRAMEFLEET_FAKE_GPU=str(ledger.path),
    )
    workers.start("cpu", env=env, wait=False)
    workers.start("gpu0", env=env, wait=False)
    wait_until(lambda: workers.state("cpu") and workers.state("gpu0"), 60, "both workers to register")
    out = tmp_path / "out"
    assert (
        run_script(
            "enqueue_dataset.py",
            str(video_factory(1, seconds=4.0)),
            "--out",
            str(out),
            "--no-wait",
            env={**pipeline_env, **env},
        ).returncode
        == 0
    )
    wait_until(lambda: ((workers.state("gpu0") or {}).get("frames") or [0])[0] > 0, 60, "gpu0 midway through depth")
    run_id = next((out / "runs").glob("*.json")).stem

    shown = run_script("status.py", "--out", str(out), env={**pipeline_env, **env}, timeout_s=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    gpu_row = next(line for line in lines if line.startswith("0 "))
    assert "Fake GPU 24GB" in gpu_row and "3.0/24.0 GiB (12%)" in gpu_row and "12%" in gpu_row
    assert "1 (1 busy)" in gpu_row and " depth " in gpu_row and "/40" in gpu_row  # the video, its stage, frames
    assert any(line.startswith("cpu ") and "CPU workers" in line and "1 (0 busy)" in line for line in lines)
    assert any(line.split() == ["gpu0", "0"] for line in lines) and any(line.split() == ["cpu", "0"] for line in lines)
    assert any(line.startswith(f"run {run_id} (in {out.resolve()}), 1 video,") for line in lines), lines
    preprocess = next(line.split() for line in lines if line.startswith("preprocess "))
    assert preprocess[1:3] == ["1", "0"] and preprocess[-1] == "done"
    depth = next(line.split() for line in lines if line.startswith("depth "))
    assert depth[1:3] == ["0", "0"]
    assert f"quarantined: 0 (in {out / 'quarantine.jsonl'})" in lines

    # Without a GPU it says so, and still lists the workers; without --out the run comes from Redis.
    from tasks.cli import status
    from worker_config.settings import load_settings

    monkeypatch.setenv("REDIS_URL", pipeline_env["REDIS_URL"])
    monkeypatch.setattr(status, "open_probe", lambda: NoGpuProbe("NVML sees no GPU"))
    text = status.render(load_settings(), None)
    assert "no GPU visible (NVML sees no GPU)" in text
    assert any(line.startswith("0 ") and "1 (1 busy)" in line for line in text.splitlines())
    assert f"run {run_id} (in {out.resolve()}), 1 video," in text and "quarantined: 0 (in Redis" in text
    workers.stop("gpu0", signal.SIGKILL)  # no need to wait out the long depth task


def test_inspect_gpu_counts_the_tasks_a_prefork_cpu_worker_ran_in_its_children(
    workers, pipeline_env, video_factory, tmp_path
):
    workers.start("cpu", pool="prefork", concurrency=1)
    assert (
        run_script(
            "enqueue_dataset.py", str(video_factory(1)), "--out", str(tmp_path / "out"), "--no-wait", env=pipeline_env
        ).returncode
        == 0
    )
    wait_until(
        lambda: (
            (tmp_path / "out" / "work").is_dir() and any((tmp_path / "out" / "work").glob("*/preprocess.done.json"))
        ),
        120,
        "preprocess on the prefork worker",
    )
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "inspect", "gpu", "-t", "10", "-d", "cpu@test", "--json"]

    def counted() -> int:
        done = subprocess.run(argv, cwd=ROOT, env=pipeline_env, capture_output=True, text=True, timeout=60)
        return done.returncode == 0 and json.loads(done.stdout)["cpu@test"]["worker"]["tasks_done"]

    assert wait_until(counted, 30, "the preprocess task to be counted") == 1

"""The worker runtime as run_local starts it (supervised solo workers, CPU ones too): claims held through a
long CPU stage, the deadline kill, RSS recycling, and a full disk."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import redis

from tasks.run import hold
from tests.conftest import run_script, settings_env, skip_unless_ci
from tests.faults.conftest import assert_nothing_lost, env_for, record, stage_runs, twice

pytestmark = pytest.mark.timeout(900)  # whole runs with faults, on a loaded 2-core machine


def _run_local(raw, out, env, *extra: str, timeout_s: float = 800) -> subprocess.CompletedProcess:
    return run_script("run_local.py", str(raw), "--out", str(out), *extra, env=env, timeout_s=timeout_s)


@pytest.mark.slow
@pytest.mark.ci_fault
def test_a_cpu_stage_longer_than_the_lease_ttl_runs_once_with_a_second_enqueue(video_factory, redis_server, tmp_path):
    raw = video_factory(1, seconds=6.0)  # its preprocess lasts several lease TTLs
    env = {**env_for(redis_server.url), "FRAMEFLEET_LEASE_TTL_S": "0.6", "FRAMEFLEET_HEARTBEAT_INTERVAL_S": "0.2"}
    out = tmp_path / "out"
    # A first enqueue waits in the queue; run_local's own (--continue) follows once its workers are up, so
    # the second preprocess of the video arrives at the second CPU worker while the first still runs.
    assert run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--no-wait", env=env).returncode == 0
    # A second run on a live run's OUT is refused now (tasks.run.hold); the claims still guard against two
    # runs of one stage when the hold is gone (a run on another Redis, a hold taken over): drop it as they do.
    for key in redis.Redis.from_url(redis_server.url).keys("ff:out:*"):
        redis.Redis.from_url(redis_server.url).delete(key)
    hold.file_path(out).unlink()
    done = _run_local(raw, out, env, "--continue", "--cpu-workers", "2")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    runs = stage_runs(out / "logs")
    assert twice(out / "logs") == {}, runs
    assert [n for (stage, _), n in runs.items() if stage == "preprocess"] == [1], runs
    record(
        "CPU stage longer than the lease TTL, enqueued twice",
        "2 chords, preprocess 10× the lease TTL",
        out,
        None,
        None,
        out / "logs",
    )


def test_a_cpu_stage_past_its_deadline_is_killed_restarted_and_quarantined_as_worker_lost(
    video_factory, redis_server, tmp_path
):
    raw = video_factory(1, seconds=6.0)  # its preprocess takes 0.4 s or more, several heartbeats past 0.05 s
    env = {
        **env_for(redis_server.url),
        "FRAMEFLEET_LEASE_TTL_S": "2",
        "FRAMEFLEET_HEARTBEAT_INTERVAL_S": "0.1",
        **settings_env(tmp_path, "stages:\n  preprocess:\n    deadline_s: 0.05\n    max_retries: 1\n"),
    }
    out = tmp_path / "out"
    done = _run_local(raw, out, env, "--cpu-workers", "1")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    failed = json.loads((out / "run_summary.json").read_text())["failed"]
    assert [(f["stage"], f["error_class"]) for f in failed] == [("preprocess", "WorkerLost")], failed
    assert "passed the 0.05 s deadline" in failed[0]["reason"], failed
    cpu_log = (out / "logs" / "cpu-1.log").read_text()
    # Two starts are the rule (max_retries 1); on a loaded machine a delivery made as the worker restarts can
    # be started, and killed, once more before the attempts are read: never fewer than two, never unbounded.
    assert 2 <= cpu_log.count("past its 0.05 s deadline: ending this worker") <= 3, cpu_log[-3000:]
    assert "exited with status 70" in done.stderr  # the supervisor saw the kill and restarted the worker
    assert_nothing_lost(out)
    record("CPU stage past its deadline", "deadline 0.05 s, the worker killed twice", out, None, None, out / "logs")


@pytest.mark.slow
@pytest.mark.ci_fault
def test_workers_above_the_rss_limit_recycle_after_each_task_and_the_run_completes(fault_raw, redis_server, tmp_path):
    env = {**env_for(redis_server.url), "FRAMEFLEET_MAX_RSS_MIB": "1"}  # every worker is above it
    out = tmp_path / "out"
    done = _run_local(fault_raw, out, env, "--limit", "2", "--cpu-workers", "1")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for name in ("cpu-1", "gpu0-1"):
        assert "recycling after 1 tasks" in (out / "logs" / f"{name}.log").read_text(), name
    assert "exited 0 (recycled)" in done.stderr
    assert twice(out / "logs") == {}
    assert_nothing_lost(out)
    record(
        "RSS recycling after every task",
        "max_rss_mib 1: every worker exits after each task",
        out,
        None,
        None,
        out / "logs",
    )


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: room for the run's records, not for a video's frames."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        skip_unless_ci(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


# In the CI fault tier (make test-ci-faults); what stands for it in `make test`:
# tests/faults/test_broker_and_storage_faults.py's unwritable output (a storage error: clear, retried, no torn file).
@pytest.mark.slow
@pytest.mark.ci_fault
def test_a_full_disk_quarantines_with_the_reason_leaves_no_torn_file_and_resumes_after(
    fault_raw, fault_workers, fault_env, small_disk, tmp_path
):
    env = settings_env(tmp_path, "stages:\n  preprocess:\n    max_retries: 1\n")
    fault_workers.start("cpu", env=env)
    fault_workers.start("gpu0", env=env)
    out = small_disk / "out"
    first = run_script(
        "enqueue_dataset.py", str(fault_raw), "--out", str(out), "--limit", "1", env={**fault_env, **env}
    )
    assert first.returncode == 1, first.stdout + first.stderr
    failed = json.loads((out / "run_summary.json").read_text())["failed"]
    assert [(f["stage"], f["error_class"]) for f in failed] == [("preprocess", "TransientIO")], failed
    assert "No space left on device" in failed[0]["reason"] and "full disk" in failed[0]["reason"]
    assert [p.name for p in out.rglob("*.tmp")] == [] and not list(out.rglob("*.npz"))
    subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
    again = run_script(
        "enqueue_dataset.py",
        str(fault_raw),
        "--out",
        str(out),
        "--limit",
        "1",
        "--retry-quarantined",
        env={**fault_env, **env},
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert twice(fault_workers.logs) == {}
    assert_nothing_lost(out)
    record(
        "full output disk, then space freed",
        "1 MiB tmpfs as the output root; --retry-quarantined after",
        out,
        None,
        None,
        fault_workers.logs,
    )
    shutil.rmtree(out, ignore_errors=True)

"""Worker faults: SIGKILL at random moments, SIGTERM's warm shutdown, the same dataset enqueued twice."""

from __future__ import annotations

import random
import signal
import time

import pytest

from tasks.delivery import queues
from tests.conftest import run_script, settings_env, wait_until
from tests.faults.conftest import assert_nothing_lost, record, stage_runs, wait_for_summary

# 4 s of depth per video, waited rather than computed: as long on a loaded machine as on an idle one.
SLOW = "stages:\n  depth:\n    params: {seconds_per_frame: 0.25}\n"


# In the CI fault tier (make test-ci-faults); what stands for it in `make test`:
# tests/test_failover.py (a worker SIGKILLed mid-task: the task completes on another within the lease TTL).
@pytest.mark.slow
@pytest.mark.ci_fault
def test_sigkill_a_gpu_worker_several_times_at_random_moments(
    fault_raw, fault_workers, fault_env, reference_stats, tmp_path
):
    env = settings_env(tmp_path, SLOW)
    fault_workers.start("cpu", env=env)
    fault_workers.start("gpu0", env=env)
    out = tmp_path / "out"
    assert (
        run_script("enqueue_dataset.py", str(fault_raw), "--out", str(out), "--no-wait", env=fault_env).returncode == 0
    )
    rng = random.Random(7)
    kills = 0
    for attempt in range(3):
        name = f"gpu0-{attempt}" if attempt else "gpu0"
        wait_until(lambda name=name: (fault_workers.state(name) or {}).get("busy"), 120, "the GPU worker to be busy")
        time.sleep(rng.uniform(0.2, 2.0))
        fault_workers.stop(name, signal.SIGKILL)
        killed_at = time.time()
        kills += 1
        fault_workers.start("gpu0", name=f"gpu0-{attempt + 1}", env=env)  # what a supervisor does
    summary = wait_for_summary(out)
    assert kills == 3 and summary["done"] == 4 and summary["failed"] == []
    assert_nothing_lost(out, reference_stats)
    record(
        "SIGKILL a GPU worker mid-task",
        "3 SIGKILLs at random moments",
        out,
        reference_stats,
        summary["finished"] - killed_at,
    )


# In the CI fault tier (make test-ci-faults); what stands for it in `make test`:
# tests/test_pipeline_e2e.py's two GPU workers, one stopping (warm) mid-run, nothing lost.
@pytest.mark.slow
@pytest.mark.ci_fault
def test_sigterm_finishes_the_task_in_hand_and_takes_no_new_one(fault_raw, fault_workers, fault_env, tmp_path):
    env = settings_env(tmp_path, SLOW)
    fault_workers.start("cpu", env=env)
    fault_workers.start("gpu0", env=env)
    out = tmp_path / "out"
    assert (
        run_script("enqueue_dataset.py", str(fault_raw), "--out", str(out), "--no-wait", env=fault_env).returncode == 0
    )
    busy = wait_until(
        lambda: (s := fault_workers.state("gpu0")) and s["busy"] and s["current"]["task"] == "framefleet.depth" and s,
        120,
        "gpu0 busy on depth",
    )
    video = busy["current"]["video"]
    assert fault_workers.stop("gpu0", signal.SIGTERM, timeout_s=120) == 0
    log = fault_workers.log("gpu0")
    assert f"ran depth of {video}" in log  # the task in hand was finished
    after = log.split("Warm shutdown", 1)[1] if "Warm shutdown" in log else ""
    assert "] received" not in after  # and no new one was taken
    fault_workers.start("gpu0", name="gpu0-b", env=env)
    assert wait_for_summary(out)["done"] == 4
    assert_nothing_lost(out)
    record("SIGTERM a GPU worker", "1 SIGTERM (warm shutdown)", out, None, None)


def test_the_same_dataset_enqueued_twice_at_once_processes_each_video_once(
    fault_raw, fault_workers, fault_env, reference_stats, tmp_path
):
    fault_workers.start("cpu")
    fault_workers.start("gpu0")
    fault_workers.start("gpu1")
    out = tmp_path / "out"
    first = run_script("enqueue_dataset.py", str(fault_raw), "--out", str(out), "--no-wait", env=fault_env)
    second = run_script(
        "enqueue_dataset.py", str(fault_raw), "--out", str(out), "--continue", "--no-wait", env=fault_env
    )
    # One live run per output folder (docs/operations-runs.md): the second is refused, naming the first.
    assert first.returncode == 0, first.stderr
    assert second.returncode == 2 and "is held by run" in second.stderr, second.stderr
    wait_for_summary(out, run_index=1)
    wait_until(lambda: all(v == 0 for v in _waiting(fault_env)), 120, "the queues to drain")
    runs = stage_runs(fault_workers.logs)
    assert runs and set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    assert len(runs) == 4 * 5
    assert_nothing_lost(out, reference_stats)
    record("same dataset enqueued twice at once", "2 chords over 4 videos", out, reference_stats, None)


def _waiting(env: dict[str, str]) -> list[int]:
    import redis

    r = redis.Redis.from_url(env["REDIS_URL"])
    return [queues.length(r, q) for q in ("cpu", "gpu0", "gpu1")] + [r.hlen("unacked")]

"""Broker and storage faults: Redis restarted or away, a task past the visibility timeout, a file in the way."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import enqueue_and_watch, run_script, settings_env, wait_until
from tests.faults.conftest import assert_nothing_lost, record, stage_runs, twice, wait_for_summary

# 4 s of depth per video, waited rather than computed: as long on a loaded machine as on an idle one.
SLOW = "stages:\n  depth:\n    params: {seconds_per_frame: 0.25}\n"


@pytest.mark.parametrize("down_s", [0, pytest.param(30, marks=[pytest.mark.slow, pytest.mark.ci_fault])])
def test_redis_restarted_or_away_mid_run(
    down_s, fault_raw, fault_workers, fault_env, redis_server, reference_stats, tmp_path
):
    env = settings_env(tmp_path, SLOW)
    fault_workers.start("cpu", env=env)
    fault_workers.start("gpu0", env=env)
    out = tmp_path / "out"
    watcher = enqueue_and_watch(fault_raw, out, {**fault_env, **env})
    wait_until(lambda: len(list(out.glob("work/*/depth.done.json"))) >= 1, 120, "the run to be under way")
    redis_server.stop()
    time.sleep(down_s)
    redis_server.start()
    back_at = time.time()
    try:
        output, _ = watcher.communicate(timeout=400)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, output[-3000:]
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["done"] == 4, summary
    assert twice(fault_workers.logs) == {} and len(stage_runs(fault_workers.logs)) == 4 * 5
    assert_nothing_lost(out, reference_stats)
    record(
        f"Redis {'restarted' if not down_s else f'stopped {down_s} s'} mid-run",
        "Redis stopped and started (AOF)",
        out,
        reference_stats,
        summary["finished"] - back_at,
        fault_workers.logs,
    )


@pytest.mark.slow
@pytest.mark.ci_fault
def test_a_task_longer_than_the_visibility_timeout_runs_once(fault_raw, fault_workers, fault_env, tmp_path):
    env = settings_env(tmp_path, "visibility_timeout_s: 5\nstages:\n  depth:\n    params: {seconds_per_frame: 1.0}\n")
    fault_workers.start("cpu", env=env)
    fault_workers.start("gpu0", env=env)
    out = tmp_path / "out"
    assert (
        run_script(
            "enqueue_dataset.py",
            str(fault_raw),
            "--out",
            str(out),
            "--limit",
            "1",
            "--no-wait",
            env={**fault_env, **env},
        ).returncode
        == 0
    )
    wait_until(
        lambda: (s := fault_workers.state("gpu0")) and (s["current"] or {}).get("task") == "framefleet.depth",
        120,
        "depth under way",
    )
    time.sleep(7)  # past the visibility timeout: a new worker restores the message on start
    fault_workers.start("gpu1", env=env)
    wait_for_summary(out)
    runs = stage_runs(fault_workers.logs)
    assert set(runs.values()) == {1}, runs
    assert_nothing_lost(out)
    record("task longer than the visibility timeout", "redelivery to a second worker", out, None, None)


def test_an_unwritable_output_gives_a_clear_error_retries_and_no_torn_file(
    fault_raw, fault_workers, fault_env, tmp_path
):
    env = settings_env(tmp_path, "stages:\n  depth:\n    max_retries: 2\n")
    fault_workers.start("cpu", env=env)
    fault_workers.start("gpu0", env=env)
    out = tmp_path / "out"
    first = run_script(
        "enqueue_dataset.py", str(fault_raw), "--out", str(out), "--limit", "1", "--no-wait", env={**fault_env, **env}
    )
    assert first.returncode == 0
    vid = json.loads((out / "manifest.json").read_text())["videos"][0]["video_id"]
    (out / "work" / vid).mkdir(parents=True, exist_ok=True)
    (out / "work" / vid / "depth.npz").mkdir()  # a directory where depth's output must go
    summary = wait_for_summary(out, timeout_s=200)
    failure = summary["failed"][0]
    assert failure["stage"] == "depth" and failure["error_class"] == "TransientIO" and failure["attempts"] == 3
    assert "depth.npz" in failure["reason"] and "retrying" in failure["reason"]
    assert [p.name for p in out.rglob("*.tmp")] == []
    assert_nothing_lost(out)
    record("unwritable output for one stage", "a directory where depth.npz goes", out, None, None)

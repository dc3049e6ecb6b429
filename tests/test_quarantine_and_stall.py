"""Quarantine records, --retry-quarantined, and the stall report of the enqueue script."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from tasks.cli.sample import make_corrupt_inputs, make_video
from tasks.records import quarantine
from tests.conftest import ROOT, run_script, settings_env


def test_failures_are_quarantined_and_can_be_retried_after_a_fix(video_factory, cluster, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(video_factory(1), raw)
    bad = make_corrupt_inputs(raw)
    pipeline_env = cluster.env
    out = tmp_path / "out"
    first = run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=pipeline_env)
    assert first.returncode == 1 and "--retry-quarantined" in first.stdout
    records = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(r["video"] for r in records) == sorted(p.name for p in bad.values())
    for record in records:
        assert {"stage", "error_class", "reason", "attempts", "worker", "time"} <= record.keys()
        assert record["worker"] == "cpu@test" and record["attempts"] == 1  # bad input: no retry
    counted = quarantine.counts(redis.Redis.from_url(pipeline_env["REDIS_URL"]))
    # Redis counts them (per output folder: other tests' folders may share this Redis); the file holds them
    assert counted.get(quarantine.root_field(out)) == len(records)
    assert sorted(json.loads((out / "run_summary.json").read_text())["quarantined"]) == sorted(
        r["video_id"] for r in records
    )

    bad["not_video"].unlink()  # the user replaces the text file with the real video
    make_video(bad["not_video"], 320, 240, 15, 1.5, seed=7)
    again = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--retry-quarantined", env=pipeline_env)
    assert again.returncode == 1
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["videos"] == 4 and summary["done"] == 1  # only the quarantined ones were sent
    assert summary["statistics_videos"] == 2
    left = [json.loads(line)["video"] for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(left) == sorted(p.name for k, p in bad.items() if k != "not_video")


def test_a_stalled_run_says_which_queue_is_stuck_and_the_whole_command_that_serves_it(
    video_factory, workers, pipeline_env, tmp_path
):
    settings = settings_env(tmp_path, "stages:\n  depth:\n    params: {seconds_per_frame: 0.01}\n")
    workers.start("cpu", env=settings)  # no GPU worker at all
    out = tmp_path / "out"
    # The default settings: the cause is named within 60 s of no progress.
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "enqueue_dataset.py"), str(video_factory(1)), "--out", str(out)],
        cwd=ROOT,
        env={**pipeline_env, **settings},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = None
    try:
        deadline, seen = time.monotonic() + 150, ""
        while time.monotonic() < deadline and "no live worker" not in seen:
            seen += proc.stderr.readline()
        assert "queue gpu0: 1 tasks waiting and no live worker" in seen, seen
        quiet_s = float(seen.split("no task finished for ")[1].split(" s:")[0])
        assert quiet_s <= 60, seen
        command = seen.split("start one with `")[1].split("`")[0]
        assert f"FRAMEFLEET_CONFIG={settings['FRAMEFLEET_CONFIG']}" in command, command
        assert f"REDIS_URL={pipeline_env['REDIS_URL']}" in command and "celery -A tasks worker -Q gpu0" in command
        # Typed in a fresh shell (no REDIS_URL, no FRAMEFLEET_CONFIG), it starts the worker that finishes the run.
        fresh = {k: v for k, v in pipeline_env.items() if k not in ("REDIS_URL", "FRAMEFLEET_CONFIG")}
        fresh["PATH"] = f"{Path(sys.executable).parent}:{fresh.get('PATH', '')}"
        started = subprocess.Popen(
            ["bash", "-c", command],
            cwd=ROOT,
            env=fresh,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _, rest = proc.communicate(timeout=240)
        assert proc.returncode == 0, seen + rest
    finally:
        proc.kill()
        proc.wait()
        if started is not None and started.poll() is None:
            os.killpg(started.pid, signal.SIGKILL)
            started.wait()

"""Runs through the `framefleet` command: refused inputs, re-attach, cancel then --continue, intermediates."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
import yaml

from tasks.outputs.stage_io import marker_shard
from tests.conftest import ROOT, settings_env, wait_until

pytestmark = pytest.mark.timeout(300)

# 16 s of depth per video, waited rather than computed (no CPU taken): 8 s past its midway progress leave
# the `framefleet cancel` process time to start and land while that depth still runs, on a loaded machine too.
SLOW_DEPTH = "stages:\n  depth:\n    params: {seconds_per_frame: 1.0}\n"


def ff(*args: str, env: dict[str, str], timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Run `framefleet ARGS` as a user would; return the completed process (text output)."""
    return subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def ff_background(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.main", *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run_id_of(out: Path) -> str:
    return sorted(p.stem for p in (out / "runs").glob("*.json"))[-1]


def test_refused_inputs_status_of_a_folder_and_ctrl_c(video_factory, pipeline_env, tmp_path):
    raw, other = video_factory(2), video_factory(1)
    out = tmp_path / "out"

    zero = ff("enqueue", str(raw), "--out", str(out), "--limit", "0", env=pipeline_env)
    assert zero.returncode == 2 and "--limit: must be at least 1, not 0" in zero.stderr, zero.stderr
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    refused = ff("enqueue", str(raw), "--out", str(a_file), "--no-wait", env=pipeline_env)
    assert refused.returncode == 2 and f"the output folder {a_file} is a file" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr

    # Ctrl-C while following: the run goes on, and the way back and the way to stop it are printed.
    follow = ff_background("enqueue", str(raw), "--out", str(out), env=pipeline_env)
    sent = follow.stdout.readline()  # "run <id>: 2 videos enqueued; outputs in OUT", then the progress
    first = run_id_of(out)
    assert sent.startswith(f"run {first}: 2 videos enqueued"), sent
    follow.send_signal(signal.SIGINT)
    stdout, _ = follow.communicate(timeout=60)
    assert follow.returncode == 130
    assert f"framefleet status --watch {first}" in stdout and f"framefleet cancel {first}" in stdout, stdout
    # The run goes on (no worker here): it holds OUT until it is cancelled.
    held = ff("enqueue", str(raw), "--out", str(out), "--continue", "--no-wait", env=pipeline_env)
    assert held.returncode == 2 and f"is held by run {first}" in held.stderr, held.stderr
    assert ff("cancel", first, env=pipeline_env).returncode == 0

    mixed = ff("enqueue", str(other), "--out", str(out), "--continue", "--no-wait", env=pipeline_env)
    assert mixed.returncode == 2 and "--add" in mixed.stderr and str(raw.resolve()) in mixed.stderr, mixed.stderr
    clash = ff("enqueue", str(other), "--out", str(out), "--continue", "--add", "--no-wait", env=pipeline_env)
    assert clash.returncode == 2 and "has the same path as a video of" in clash.stderr, clash.stderr
    other = tmp_path / "more"
    other.mkdir()
    shutil.copy(next(video_factory(1).glob("*.mp4")), other / "extra clip.mp4")
    added = ff("enqueue", str(other), "--out", str(out), "--continue", "--add", "--no-wait", env=pipeline_env)
    assert added.returncode == 0, added.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset_root"] == str(raw.resolve())
    roots = sorted(v.get("root", manifest["dataset_root"]) for v in manifest["videos"])
    assert roots == sorted([str(raw.resolve())] * 2 + [str(other.resolve())])

    elsewhere = tmp_path / "elsewhere"
    assert ff("enqueue", str(raw), "--out", str(elsewhere), "--no-wait", env=pipeline_env).returncode == 0
    shown = ff("status", "--out", str(out), env=pipeline_env)
    assert shown.returncode == 0, shown.stderr
    assert f"run {run_id_of(out)} (in {out.resolve()}), 1 video," in shown.stdout, shown.stdout
    assert run_id_of(elsewhere) not in shown.stdout


@pytest.mark.timeout(600)
def test_cancel_stops_the_run_and_continue_finishes_it(video_factory, workers, pipeline_env, tmp_path):
    raw = video_factory(2)
    env = settings_env(tmp_path, SLOW_DEPTH)
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env)
    out = tmp_path / "out"

    idle_gpu = ff("enqueue", str(raw), "--out", str(out), "--gpus", "0,1", "--no-wait", env=pipeline_env)
    assert idle_gpu.returncode == 0, idle_gpu.stderr
    assert "--gpus names GPU 1, but no live worker serves gpu1" in idle_gpu.stderr, idle_gpu.stderr
    run_id = run_id_of(out)
    watcher = ff_background("status", "--watch", "--out", str(out), env=pipeline_env)

    def depth_midway() -> bool:
        state = workers.state("gpu0") or {}
        frames = state.get("frames") or [0, 0]
        return (state.get("current") or {}).get("task") == "framefleet.depth" and 0 < frames[0] < frames[1]

    wait_until(depth_midway, 180, "gpu0 midway through a depth")
    running = workers.state("gpu0")["current"]["video"]
    cancelled = ff("cancel", run_id, env=pipeline_env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"run {run_id} cancelled" in cancelled.stdout and "--continue" in cancelled.stdout
    wait_until(lambda: not (workers.state("gpu0") or {}).get("busy"), 240, "the running depth to stop at its check")
    record = json.loads((out / "runs" / f"{run_id}.json").read_text())
    assert record["status"] == "cancelled" and record["cancelled"] >= record["started"]
    stdout, stderr = watcher.communicate(timeout=60)
    assert watcher.returncode == 4 and f"run {run_id} was cancelled" in stderr, stdout + stderr
    broker = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    from tasks.delivery import queues

    assert queues.lengths(broker, ["cpu", "gpu0", "gpu1"]) == {"cpu": 0, "gpu0": 0, "gpu1": 0}
    assert not (out / "work" / running / "depth.npz").exists()  # stopped, not half-written
    # No callback will read the cancelled run's per-video keys: they go (docs/redis-keys.md).
    assert not broker.exists(f"ff:run:{run_id}:attempts", f"ff:run:{run_id}:pending")
    assert 0 < broker.ttl(f"ff:run:{run_id}:stages") <= 600
    assert (out / "runs" / f"{run_id}.stages.jsonl").exists()
    assert list(out.rglob("*.tmp")) == []

    again = ff("enqueue", str(raw), "--out", str(out), "--continue", "--no-wait", env=pipeline_env)
    assert again.returncode == 0, again.stderr
    reattached = ff("status", "--watch", run_id_of(out), env=pipeline_env, timeout_s=400)
    assert reattached.returncode == 0, reattached.stdout + reattached.stderr
    assert "done: 2 of 2 videos; statistics over 2 videos" in reattached.stdout, reattached.stdout
    check = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "verify", str(out)],
        cwd=ROOT,
        env=pipeline_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_dropped_intermediates_keep_continue_and_statistics_whole(video_factory, cluster, tmp_path):
    raw = video_factory(2)
    pipeline_env = cluster.env
    out = tmp_path / "out"

    kept = ff("enqueue", str(raw), "--out", str(out), "--limit", "1", env=pipeline_env)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "intermediates: " in kept.stdout and f"framefleet clean {out}" in kept.stdout
    (first,) = [p.name for p in (out / "work").iterdir()]

    dropped = ff("enqueue", str(raw), "--out", str(out), "--continue", "--intermediates", "drop", env=pipeline_env)
    assert dropped.returncode == 0, dropped.stdout + dropped.stderr
    assert "1 already complete" in dropped.stdout
    assert [p.name for p in (out / "work").iterdir()] == [first]  # only the earlier run's video keeps them
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["statistics_videos"] == 2
    stats = yaml.safe_load((out / "normalization_stats.yaml").read_text())

    cleaned = ff("clean", str(out), env=pipeline_env)
    assert cleaned.returncode == 0 and "dropped the intermediates of 1 video (" in cleaned.stdout, cleaned.stdout
    assert list((out / "work").iterdir()) == []
    kept = sorted(str(p.relative_to(out / "markers")) for p in (out / "markers").rglob("*.*"))
    markers = sorted(f"{marker_shard(p.stem)}/{p.stem}.hdf5.done.json" for p in out.glob("*.hdf5"))
    assert [k for k in kept if k.endswith(".done.json")] == markers  # the markers, in shards
    others = [k for k in kept if not k.endswith(".done.json")]  # their partials and the saved sums, in a few files
    assert "sums.json" in others and all(
        k in ("partials.bin", "sums.json") or k.startswith("partials/") for k in others
    )

    again = ff("enqueue", str(raw), "--out", str(out), "--continue", env=pipeline_env)
    assert again.returncode == 0 and "nothing to do: every one of the 2 videos" in again.stdout, again.stdout
    assert yaml.safe_load((out / "normalization_stats.yaml").read_text()) == stats

    # An output folder of an earlier version: its markers directly in OUT/markers/, no partials file, no
    # saved sums. A --continue pools the statistics again (with nothing else to do), in another order than the
    # sums added up: the same to 1e-12.
    (out / "markers" / "partials.bin").unlink(missing_ok=True)
    shutil.rmtree(out / "markers" / "partials", ignore_errors=True)
    (out / "markers" / "sums.json").unlink()
    for marker in list((out / "markers").rglob("*.hdf5.done.json")):
        marker.rename(out / "markers" / marker.name)
    older = ff("enqueue", str(raw), "--out", str(out), "--continue", env=pipeline_env)
    assert older.returncode == 0 and "2 already complete" in older.stdout, older.stdout + older.stderr
    pooled = yaml.safe_load((out / "normalization_stats.yaml").read_text())
    assert pooled.keys() == stats.keys()
    for k, v in stats.items():
        if isinstance(v, (list, float)):
            np.testing.assert_allclose(pooled[k], v, rtol=1e-12, atol=0, err_msg=k)
        else:
            assert pooled[k] == v, k
    check = ff("verify", str(out), env=pipeline_env, timeout_s=120)
    assert check.returncode == 0, check.stdout + check.stderr

"""Continue mode: a run stopped halfway and continued processes no video twice, statistics unchanged."""

from __future__ import annotations

import json
import signal

import redis
import yaml

from tasks.records import manifest
from tests.conftest import run_script, settings_env, wait_until

# About a second of depth per video, waited rather than computed: as long on a loaded machine as on an idle one.
SLOW_GPU = "stages:\n  depth:\n    params: {seconds_per_frame: 0.06}\n"


def outputs_of(out, vid):
    """(inode, mtime) of every output of a video: a rewrite changes them."""
    files = [out / f"{vid}.hdf5", *sorted((out / "work" / vid).iterdir())]
    return {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in files}


def close(a, b):
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)
    return a == b


def test_stop_halfway_then_continue(video_factory, workers, pipeline_env, tmp_path):
    raw = video_factory(6)
    env = settings_env(tmp_path, SLOW_GPU)
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env)
    out = tmp_path / "out"
    assert run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--no-wait", env=pipeline_env).returncode == 0
    wait_until(lambda: len(list(out.glob("*.hdf5"))) >= 3, 180, "half of the videos")
    for name in ("gpu0", "cpu"):
        workers.stop(name, signal.SIGKILL)
    redis.Redis.from_url(pipeline_env["REDIS_URL"]).flushdb()  # the whole cluster is gone

    first = {p.stem: outputs_of(out, p.stem) for p in out.glob("*.hdf5")}
    assert 3 <= len(first) < 6
    refused = run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=pipeline_env)
    assert refused.returncode == 2 and "--continue" in refused.stderr and "--force" in refused.stderr

    workers.start("cpu", name="cpu2", env=env)
    workers.start("gpu0", name="gpu0b", env=env)
    again = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--continue", env=pipeline_env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{len(first)} already complete" in again.stdout
    assert "never ended (Redis no longer holds it)" in again.stderr, again.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["already_complete"] == len(first)
    assert summary["videos"] == summary["done"] == 6 - len(first)
    assert summary["statistics_videos"] == 6  # earlier runs' videos are in the statistics
    for vid, files in first.items():
        assert outputs_of(out, vid) == files, f"{vid} was processed twice"
    # the first run never ended (its Redis state is gone), yet what it made of its videos is in the manifest
    entries = {e["video_id"]: e for e in manifest.read(out)["videos"]}
    assert {vid: e.get("status") for vid, e in entries.items()} == dict.fromkeys(entries, "done"), entries
    assert all(entries[vid]["provenance"]["run_id"] != summary["run_id"] for vid in first), entries
    assert not list((out / "runs").glob("*.outcomes.live")), sorted(p.name for p in (out / "runs").iterdir())

    fresh = tmp_path / "fresh"
    assert run_script("enqueue_dataset.py", str(raw), "--out", str(fresh), env=pipeline_env).returncode == 0
    resumed = yaml.safe_load((out / "normalization_stats.yaml").read_text())
    uninterrupted = yaml.safe_load((fresh / "normalization_stats.yaml").read_text())
    assert resumed.keys() == uninterrupted.keys()
    for key in resumed:
        assert close(resumed[key], uninterrupted[key]), key
    check = run_script("verify_dataset.py", str(out), env=pipeline_env)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_corrupted_output_is_redone_and_force_redoes_everything(video_factory, cluster, tmp_path):
    raw = video_factory(2)
    pipeline_env = cluster.env
    out = tmp_path / "out"
    assert run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=pipeline_env).returncode == 0
    victim, other = sorted(p.stem for p in out.glob("*.hdf5"))
    before = outputs_of(out, other)
    with open(out / f"{victim}.hdf5", "r+b") as fh:  # same size, different bytes: only the hash tells
        fh.seek(4096)
        fh.write(b"\x00" * 64)
    again = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--continue", env=pipeline_env)
    assert again.returncode == 0 and "1 already complete" in again.stdout, again.stdout + again.stderr
    assert outputs_of(out, other) == before
    check = run_script("verify_dataset.py", str(out), env=pipeline_env)
    assert check.returncode == 0, check.stdout
    forced = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--force", env=pipeline_env)
    assert forced.returncode == 0
    assert outputs_of(out, other)[f"{other}.hdf5"] != before[f"{other}.hdf5"]

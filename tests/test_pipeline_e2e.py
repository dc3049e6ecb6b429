"""The pipeline end to end with real Redis, real `celery worker` processes and real videos."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
from pathlib import Path

import h5py
import redis

from tasks.cli.sample import make_corrupt_inputs
from tests.conftest import run_script, settings_env, task_result, wait_until

# About a second of depth per video, waited rather than computed: as long on a loaded machine as on an idle one.
SLOW_GPU = "stages:\n  depth:\n    params: {seconds_per_frame: 0.06}\n"


def hdf5_ids(out: Path) -> set[str]:
    return {p.stem for p in out.glob("*.hdf5")}


def manifest_ids(out: Path) -> set[str]:
    return {v["video_id"] for v in json.loads((out / "manifest.json").read_text())["videos"]}


def processes_using(port: int) -> list[int]:
    """Pids of processes whose environment names the Redis on ``port``."""
    found = []
    # Not followed by a digit: another test session's Redis on port 63791 is not this one on 6379.
    needle = re.compile(rb"127\.0\.0\.1:%d(?!\d)" % port)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle.search((entry / "environ").read_bytes()) or needle.search((entry / "cmdline").read_bytes()):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_local_cluster_runs_a_dataset_and_leaves_nothing_behind(video_factory, pipeline_env, tmp_path):
    raw = video_factory(4)
    out = tmp_path / "out"
    env = {k: v for k, v in pipeline_env.items() if k != "REDIS_URL"}  # the embedded default
    done = run_script("run_local.py", str(raw), "--out", str(out), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Flower: http://127.0.0.1:" in done.stdout
    port = int(re.search(r"private redis-server at redis://127.0.0.1:(\d+)/0 \(", done.stdout).group(1))
    # Its password: in OUT/logs/redis-auth.txt (mode 0600) and the processes' environments, in no output or log.
    auth = out / "logs" / "redis-auth.txt"
    password = auth.read_text().partition("://:")[2].partition("@")[0]
    assert len(password) >= 24 and stat.S_IMODE(auth.stat().st_mode) == 0o600
    assert f"(password in {auth})" in done.stdout
    for text in [done.stdout, done.stderr, *(p.read_text(errors="replace") for p in (out / "logs").glob("*.log"))]:
        assert password not in text

    ids = manifest_ids(out)
    assert len(ids) == 4 and hdf5_ids(out) == ids
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["videos"] == summary["done"] == summary["statistics_videos"] == 4
    assert summary["failed"] == [] and set(summary["done_videos"]) == ids
    stats = (out / "normalization_stats.yaml").read_text()
    frames = 0
    for vid in ids:
        with h5py.File(out / f"{vid}.hdf5") as f:
            frames += int(f["root/num_frames"][()])
            windows = len(f["root/tracks"])
    assert f"pose_num_samples: {sum(_windows(out / f'{v}.hdf5') for v in ids) * 10}" in stats
    assert frames > 0 and windows > 0
    assert (out / "settings.resolved.yaml").exists()
    assert processes_using(port) == [], "run_local left processes behind"
    # No GPU here: one worker per core (as memory allows) consumes gpu0 and cpu both, with its share of the cores.
    workers = int(re.search(r"no GPU found: (\d+) CPU worker\(s\), each hosting every stage", done.stdout).group(1))
    logs = {p.stem: p.read_text() for p in (out / "logs").glob("gpu0+cpu-*.log")}
    assert sorted(logs) == [f"gpu0+cpu-{i}" for i in range(1, workers + 1)], sorted(logs)
    assert not list((out / "logs").glob("cpu-*.log")) and not list((out / "logs").glob("gpu0-*.log"))
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    assert all(f"torch uses {threads} CPU threads" in log for log in logs.values())
    ran = " ".join(logs.values())
    assert all(f"Task framefleet.{stage}[" in ran for stage in ("preprocess", "depth", "tracks", "hands", "h5"))
    check = run_script("verify_dataset.py", str(out), env=env)
    assert check.returncode == 0, check.stdout + check.stderr


def _windows(path: Path) -> int:
    with h5py.File(path) as f:
        return len(f["root/tracks"])


def _wait_for_run(out: Path, redis_url: str, timeout_s: float = 240) -> dict:
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    meta = wait_until(
        lambda: task_result(redis_url, record["callback_id"]), timeout_s, "the statistics callback", poll_s=0.5
    )
    assert meta["status"] == "SUCCESS", meta
    return json.loads((out / "run_summary.json").read_text())


def test_two_gpu_workers_share_the_videos_and_one_stopping_loses_nothing(
    video_factory, workers, pipeline_env, tmp_path, monkeypatch
):
    raw = video_factory(6)
    env = settings_env(tmp_path, SLOW_GPU)
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env)
    workers.start("gpu1", env=env)
    out = tmp_path / "out"
    sent = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--no-wait", env=pipeline_env)
    assert sent.returncode == 0, sent.stderr
    # Stop gpu1 (warm shutdown) as soon as it has finished some work and videos remain.
    wait_until(lambda: (workers.state("gpu1") or {}).get("tasks_done", 0) >= 1, 120, "gpu1 to work")
    assert workers.stop("gpu1", signal.SIGTERM) == 0

    monkeypatch.setenv("REDIS_URL", pipeline_env["REDIS_URL"])
    from tasks import configure
    from worker_config.settings import load_settings

    configure(load_settings())
    summary = _wait_for_run(out, pipeline_env["REDIS_URL"])
    assert summary["done"] == 6 and summary["failed"] == []
    assert hdf5_ids(out) == manifest_ids(out)
    depth_workers = summary["stages"]["depth"]["workers"]
    assert set(depth_workers) == {"gpu0@test", "gpu1@test"}, "both GPU workers should have run depth"
    assert sum(depth_workers.values()) == 6
    state = workers.state("gpu0")
    # However many videos gpu0 processed, it loaded each model once.
    assert state["tasks_done"] >= 6
    assert state["model_loads"] == {"depth": 1, "tracks": 1, "hands": 1}
    from tasks.delivery import queues

    assert queues.length(redis.Redis.from_url(pipeline_env["REDIS_URL"]), "gpu1") == 0
    # Statistics merged from two workers' outputs equal one float64 pass over the files.
    check = run_script("verify_dataset.py", str(out), env=pipeline_env)
    assert check.returncode == 0, check.stdout + check.stderr


def test_corrupt_inputs_end_as_failure_records_and_the_rest_finishes(video_factory, cluster, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(video_factory(2), raw)
    bad = make_corrupt_inputs(raw)
    out = tmp_path / "out"
    result = run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=cluster.env)
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["done"] == 2 and summary["statistics_videos"] == 2
    failed = {Path(f["video"]).name: f for f in summary["failed"]}
    assert set(failed) == {p.name for p in bad.values()}
    for name, record in failed.items():
        assert record["stage"] == "preprocess" and record["error_class"] == "BadInput"
        assert name in record["reason"], record  # the reason names the file
        assert name in result.stdout  # and the script lists it
    assert (out / "normalization_stats.yaml").exists()


def test_bad_input_gets_a_clear_error_and_changes_nothing(video_factory, pipeline_env, tmp_path):
    raw = video_factory(2)
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    cases = [
        ([str(tmp_path / "missing"), "--out", str(out)], {}, "does not exist"),
        ([str(empty), "--out", str(out)], {}, "no videos in"),
        ([str(raw), "--out", str(raw / "out")], {}, "inside the input folder"),
        (
            [str(raw), "--out", str(out)],
            {"REDIS_URL": "redis://127.0.0.1:1/0"},
            "cannot reach Redis at redis://127.0.0.1:1/0",
        ),
        ([str(raw), "--out", str(out)], {"FRAMEFLEET_STAGES__DEPTH__BACKEND": "vipe9"}, "unknown backend 'vipe9'"),
    ]
    for args, extra, message in cases:
        result = run_script("enqueue_dataset.py", *args, env={**pipeline_env, **extra}, timeout_s=60)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (message, result.stderr)
        assert not out.exists() and not (raw / "out").exists()
    assert (
        "redis-server"
        in run_script(
            "enqueue_dataset.py",
            str(raw),
            "--out",
            str(out),
            env={**pipeline_env, "REDIS_URL": "redis://127.0.0.1:1/0"},
        ).stderr
    )

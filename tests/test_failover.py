"""Fast failover: a worker killed mid-task loses nothing, and its task finishes elsewhere soon."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tasks.outputs.stage_io import marker_shard
from tasks.run import runs
from tests.conftest import ROOT, run_script, settings_env, wait_for_run_end, wait_until

LEASE_TTL_S = 6
# Soon: a few lease TTLs, however loaded the machine (the requeue waits a TTL, the reaper and the surviving
# worker each take a turn), and still nothing like the visibility timeout (12 h) a lost message would wait.
RESTART_WITHIN_S = LEASE_TTL_S * 8
# 32 s of depth per video, waited rather than computed (no CPU taken): it outlasts the start of the second
# worker (torch, the models: seconds on a loaded machine) before the first is killed mid-depth.
SLOW_DEPTH = "stages:\n  depth:\n    params: {seconds_per_frame: 2.0}\n"


def test_sigkilled_worker_task_completes_on_another_within_the_lease_ttl(
    video_factory, workers, pipeline_env, tmp_path
):
    raw = video_factory(1)
    env = settings_env(tmp_path, SLOW_DEPTH, FRAMEFLEET_LEASE_TTL_S=str(LEASE_TTL_S))
    workers.start("cpu", env=env)
    workers.start("gpu1", env=env)
    out = tmp_path / "out"
    # Only GPU 1 has a worker when the depth task is sent, so it is routed there.
    assert (
        run_script(
            "enqueue_dataset.py", str(raw), "--out", str(out), "--no-wait", env={**pipeline_env, **env}
        ).returncode
        == 0
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.main", "status", "--watch", "--out", str(out)],
        cwd=ROOT,
        env={**pipeline_env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    busy = wait_until(
        lambda: (
            (s := workers.state("gpu1")) and s["busy"] and (s["current"] or {}).get("task") == "framefleet.depth" and s
        ),
        120,
        "gpu1 busy on depth",
    )
    victim = busy["current"]["video"]
    workers.start("gpu0", env=env)
    killed_at = time.monotonic()
    workers.stop("gpu1", signal.SIGKILL)

    wait_until(
        lambda: (
            (s := workers.state("gpu0"))
            and (s["current"] or {}).get("video") == victim
            and s["current"]["task"] == "framefleet.depth"
        ),
        RESTART_WITHIN_S,
        f"{victim}'s depth restarting",
    )
    restarted_s = time.monotonic() - killed_at
    assert restarted_s < RESTART_WITHIN_S, restarted_s  # not the visibility timeout (12 h)
    marker = out / "work" / victim / "depth.done.json"
    wait_until(marker.exists, 120, f"{victim}'s depth on the surviving worker")
    recovered_s = time.monotonic() - killed_at
    summary = wait_for_run_end(out, 180)  # every file of the end written, the record's too
    assert summary["done"] == 1 and summary["failed"] == []
    assert summary["stages"]["depth"]["workers"].get("gpu0@test") >= 1
    # Exactly one output per stage and video, no temporary file left behind.
    assert sorted(p.name for p in out.rglob("*.tmp")) == []
    # The run's record is the end's last write (what wait_for_run_end waits for): nothing in OUT is newer.
    written_ns = runs.path(out, summary["run_id"]).stat().st_mtime_ns
    newer = [str(p) for p in out.rglob("*") if p.is_file() and p.stat().st_mtime_ns > written_ns]
    assert not newer and (out / "report.html").is_file(), newer
    for vid in summary["done_videos"]:
        names = sorted(p.name for p in (out / "work" / vid).iterdir())
        expected = [f"{s}{ext}" for s in ("preprocess", "depth", "tracks", "hands") for ext in (".npz", ".done.json")]
        assert names == sorted(expected)
        marker = out / "markers" / marker_shard(vid) / f"{vid}.hdf5.done.json"
        assert marker.is_file()  # the partial statistics, outside work/, in one of 256 shards
    # The requeue is a line of the progress output and an entry of the run summary.
    (requeued,) = summary["requeued"]
    assert requeued["stage"] == "depth" and requeued["video_id"] == victim and "worker was lost" in requeued["why"]
    stdout, stderr = follower.communicate(timeout=60)
    assert follower.returncode == 0, stdout + stderr
    assert f"requeued depth of {requeued['video']}: its worker was lost" in stdout, stdout
    print(f"restarted after {restarted_s:.1f} s, depth done after {recovered_s:.1f} s")

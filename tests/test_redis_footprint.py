"""What a finished video leaves in Redis (docs/redis-keys.md): real runs on one Redis, then "an hour after".

An hour is simulated as bench/redis_per_video.py did (in git at b08a959): every key whose remaining TTL is at most an
hour is deleted, as Redis would have expired it by then.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import redis

from tests.conftest import ROOT, run_script, wait_until

pytestmark = pytest.mark.timeout(600)

HOUR_S = 3600
PER_VIDEO_BOUND_B = 300  # issue 29: what a finished video may leave once its run has ended
PER_RUN_BOUND_B = 3000  # the run's hash (its record, counters, end), its id in ff:runs, the callback's result
GLOBAL = ("_kombu.", "ff:metrics:", "ff:gpu-queues", "ff:worker-seen", "ff:profiles", "ff:autoscale", "unacked")


def kept_bytes(r: redis.Redis) -> int:
    """Bytes (MEMORY USAGE) of the keys left an hour from now, but those every Redis in use holds once."""
    for key in list(r.scan_iter(count=1000)):
        if 0 <= r.ttl(key) <= HOUR_S:
            r.delete(key)
    return sum(r.memory_usage(k, samples=0) or 0 for k in r.scan_iter(count=1000) if not k.startswith(GLOBAL))


def test_a_finished_video_leaves_at_most_300_bytes_an_hour_after_its_run(
    video_factory, workers, pipeline_env, tmp_path
):
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)
    clips = sorted(video_factory(7, seconds=1.0).iterdir())
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    workers.start("cpu")
    workers.start("gpu0")
    sizes, kept = [1, 6], [0]
    for i, size in enumerate(sizes):
        for clip in clips[sum(sizes[:i]) : sum(sizes[: i + 1])]:
            shutil.copy(clip, raw / clip.name)
        flags = ["--continue"] if i else []
        done = run_script(
            "enqueue_dataset.py", str(raw), "--out", str(out), "--intermediates", "drop", *flags, env=pipeline_env
        )
        assert done.returncode == 0, done.stdout + done.stderr
        summary = json.loads((out / "run_summary.json").read_text())
        assert summary["done"] == size, summary
        run_id = summary["run_id"]
        # At the run's end: its per-video keys are on their way out, its files hold them.
        left = {k: r.ttl(k) for k in r.scan_iter(match=f"ff:run:{run_id}:*")}
        assert left and all(0 < ttl <= 600 for ttl in left.values()), left
        assert not r.exists(f"ff:run:{run_id}:done", f"ff:run:{run_id}:attempts")
        # The enqueuer returns once the statistics callback has written the files; that task's own end
        # (ack, owner record removed) follows on its worker a moment later.
        wait_until(
            lambda: not list(r.scan_iter(match="ff:lease-owner:*")), 30, "every finished task's owner record removed"
        )
        assert len((out / "runs" / f"{run_id}.stages.jsonl").read_text().splitlines()) == 5 * size
        kept.append(kept_bytes(r))

    first_run, second_run = kept[1] - kept[0], kept[2] - kept[1]
    per_video = (second_run - first_run) / (sizes[1] - sizes[0])
    assert per_video <= PER_VIDEO_BOUND_B, (first_run, second_run, per_video)
    assert second_run <= PER_RUN_BOUND_B + PER_VIDEO_BOUND_B * sizes[1], (first_run, second_run)
    assert json.loads(r.hget(f"ff:run:{run_id}", "record"))["status"] == "finished"

    # What remains still answers: status (newest run, no OUT given), the statistics, --continue.
    status = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "status"], cwd=ROOT, env=pipeline_env, capture_output=True, text=True
    )
    assert status.returncode == 0, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    assert any(line.startswith(f"run {run_id} (in {out.resolve()}), 6 videos,") for line in lines), lines
    assert any(line.split()[:3] == ["h5", "6", "0"] and line.split()[-1] == "done" for line in lines), lines
    again = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--continue", env=pipeline_env)
    # Every video complete: nothing is sent, and the summary stays the last run's.
    assert again.returncode == 0 and "nothing to do: every one of the 7 videos" in again.stdout, again.stdout
    assert json.loads((out / "run_summary.json").read_text())["statistics_videos"] == 7

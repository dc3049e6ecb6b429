"""A run's end without a chord: the completion counter, the enqueue window held in Redis, the partials files.

Real Redis and, for the runs, real `celery worker` processes and real videos.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import redis

from tests.conftest import ROOT, run_script, settings_env, task_result, wait_until

SLOW_GPU = "stages:\n  depth:\n    params: {matmuls_per_frame: 20}\n"


def configure_for(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """Point this process's Celery app and settings at the test's Redis."""
    monkeypatch.setenv("REDIS_URL", url)
    from tasks import configure
    from worker_config.settings import load_settings

    configure(load_settings())


def waiting(r: redis.Redis, queue: str = "cpu") -> list[tuple[str, str]]:
    """(task name, task id) of every message waiting in ``queue`` (any of its priority lists)."""
    from tasks.delivery.queues import waiting as queued
    from tasks.run.cancel import decode

    return [decode(raw)[:2] for _, raw in queued(r, queue)]


def test_the_count_is_per_video_and_the_callback_is_sent_once(redis_url, monkeypatch, tmp_path):
    configure_for(monkeypatch, redis_url)
    from tasks.job import Failure, StageTiming
    from tasks.run import completion, runs
    from tasks.run.dataset import build_jobs

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    entries = [{"video_id": f"v{i}", "path": f"v{i}.mp4"} for i in range(3)]
    jobs, run = build_jobs(entries, tmp_path, tmp_path / "out", "run1")
    record = {**run, "callback_id": "callback-1"}
    runs.publish(r, record, 3600)
    completion.hold(r, "run1", jobs[1:], 3600)  # a window of one: v0 in flight, v1 and v2 held
    assert completion.pending_count(r, "run1") == 2

    first = replace(jobs[0], timings={"h5": StageTiming(start=1.0, end=2.0, worker="w", skipped=False)})
    completion.video_ended(r, first, 3600)
    assert [name for name, _ in waiting(r)] == ["framefleet.preprocess"]  # v1 released
    completion.video_ended(r, first, 3600)  # a redelivery of v0's last task: neither counted nor releasing
    assert len(waiting(r)) == 1 and completion.pending_count(r, "run1") == 1

    failed = replace(jobs[1], failed=Failure("preprocess", "BadInput", "x", 1, "w", 0.0))
    completion.video_ended(r, failed, 3600)
    assert len(waiting(r)) == 2 and completion.pending_count(r, "run1") == 0

    last = jobs[2]
    threads = [threading.Thread(target=completion.video_ended, args=(r, last, 3600)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    callbacks = [task_id for name, task_id in waiting(r) if name == "framefleet.aggregate"]
    assert callbacks == ["callback-1"], waiting(r)  # eight deliveries of the last task, one callback
    completion.video_ended(r, last, 3600)
    assert len(waiting(r)) == 3
    # Each video counted once, however often its end came; its line in the run's outcomes files (live).
    fields, failures = completion.counted(r, "run1")
    assert (
        fields["videos"] == 3 and fields["done"] == 2 and fields["s:h5:tasks"] == 1 and fields["s:h5:us"] == 1_000_000
    )
    assert [f["video_id"] for f in failures] == ["v1"] and failures[0]["stage"] == "preprocess"
    from tasks.records import outcome_files

    lines = outcome_files.read(outcome_files.live_dir(tmp_path / "out", "run1"))
    assert lines.status == {"v0": "done", "v1": "failed", "v2": "done"} and not lines.disagree


def test_the_last_task_redelivered_after_dying_mid_send_sends_the_callback(redis_url, monkeypatch, tmp_path):
    """A worker killed between the flag and the send: the same task, delivered again, sends the callback."""
    configure_for(monkeypatch, redis_url)
    from tasks import keys
    from tasks.run import completion, runs
    from tasks.run.dataset import build_jobs

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    jobs, run = build_jobs([{"video_id": "v0", "path": "v0.mp4"}], tmp_path, tmp_path / "out", "run3")
    runs.publish(r, {**run, "callback_id": "callback-3"}, 3600)
    flag = keys.RUN_AGGREGATED_FIELD  # a field of the run's hash
    r.hset(runs.redis_key("run3"), flag, "sending task-a")  # what task-a left when its worker died before the send
    completion.video_ended(r, jobs[0], 3600, sender="task-b")  # another task: not its mark
    assert waiting(r) == []
    completion.video_ended(r, jobs[0], 3600, sender="task-a")  # task-a's redelivery
    assert waiting(r) == [("framefleet.aggregate", "callback-3")]
    assert r.hget(runs.redis_key("run3"), flag) == "sent callback-3"
    completion.video_ended(r, jobs[0], 3600, sender="task-a")  # once sent, never again
    assert len(waiting(r)) == 1


def test_a_cancelled_run_sends_none_of_its_held_videos(redis_url, monkeypatch, tmp_path):
    configure_for(monkeypatch, redis_url)
    from tasks.run import completion, runs
    from tasks.run.dataset import build_jobs

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    entries = [{"video_id": f"v{i}", "path": f"v{i}.mp4"} for i in range(3)]
    jobs, run = build_jobs(entries, tmp_path, tmp_path / "out", "run2")
    runs.publish(r, {**run, "callback_id": "callback-2"}, 3600)
    completion.hold(r, "run2", jobs[1:], 3600)
    assert completion.drop_pending(r, "run2") == 2  # what `framefleet cancel` does first
    completion.video_ended(r, jobs[0], 3600)  # v0 ends after the cancel
    assert waiting(r) == []


def _enqueue_background(raw: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.main", "enqueue", str(raw), "--out", str(out), *extra],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_a_worker_killed_between_sending_a_held_video_and_marking_it_sent_loses_no_video(
    video_factory, workers, pipeline_env, tmp_path
):
    """A held video is sent first, then marked sent: the task whose worker died between the two sends it again
    when it is delivered again. Marked first, it would never be sent: only the sweep, long after, resends it."""
    env = settings_env(tmp_path, "", FRAMEFLEET_LEASE_TTL_S="3")
    killed = workers.start("cpu", env=env, extra=["-I", "tests.killed_between_send_and_mark"])
    workers.start("gpu0", env=env)
    out = tmp_path / "out"
    enqueuer = _enqueue_background(video_factory(2), out, {**pipeline_env, **env}, "--window", "1")
    assert killed.wait(timeout=240) == -signal.SIGKILL, workers.log("cpu")  # as the first video ended
    assert "fault point: killed before the " in workers.log("cpu"), workers.log("cpu")
    workers.start("cpu", name="cpu-2", env=env)  # takes the killed worker's task once its lease has lapsed
    stdout, stderr = enqueuer.communicate(timeout=300)
    assert enqueuer.returncode == 0, stdout + stderr
    summary = json.loads((out / "run_summary.json").read_text())
    # Both videos done, and none by the sweep: the killed worker's task, delivered again (by the lease reaper, or
    # restored from unacked when the next worker starts: either way), sent the held video itself.
    assert (summary["done"], summary["failed"], summary["resent"]) == (2, [], []), summary


def test_a_window_of_one_finishes_every_video_without_its_enqueuer_and_counts_failures(
    video_factory, workers, pipeline_env, tmp_path, monkeypatch
):
    from tasks.cli.sample import make_corrupt_inputs

    raw = tmp_path / "raw"
    raw.mkdir()
    for clip in video_factory(3).iterdir():
        shutil.copy(clip, raw / clip.name)  # not links: an input may not lead out of its folder
    shutil.copy(make_corrupt_inputs(tmp_path / "bad")["truncated"], raw)  # fails in preprocess
    videos = sorted(p for p in raw.iterdir() if p.suffix == ".mp4")
    env = settings_env(tmp_path, SLOW_GPU)
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env)
    out = tmp_path / "out"
    enqueuer = _enqueue_background(raw, out, {**pipeline_env, **env}, "--window", "1")
    line = enqueuer.stdout.readline()
    assert " enqueued" in line, line + enqueuer.stderr.read()
    enqueuer.send_signal(signal.SIGKILL)  # the run must not need it any more
    enqueuer.wait(timeout=30)

    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert record["window"] == 1 and record["videos"] == len(videos)
    meta = wait_until(lambda: task_result(pipeline_env["REDIS_URL"], record["callback_id"]), 400, "the statistics")
    assert meta["status"] == "SUCCESS", meta
    summary = json.loads((out / "run_summary.json").read_text())
    good = len(list(out.glob("*.hdf5")))
    assert summary["videos"] == len(videos) and summary["done"] == good == summary["statistics_videos"]
    assert len(summary["failed"]) == len(videos) - good >= 1 and summary["quarantined"]
    assert good >= 3

    configure_for(monkeypatch, pipeline_env["REDIS_URL"])
    from tasks.cli.verify import verify
    from tasks.observe import progress
    from tasks.run import completion

    r = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)
    assert verify(out) == []  # the statistics of one NumPy pass over the files
    # A window of one: each video started after the one before it had ended.
    # (From the run's stage log in OUT/runs/: its outcomes left Redis once written to its files.)
    from tasks.records import manifest, outcome_files
    from tasks.run import runs

    logged, where = runs.stage_log(None, out, record["run_id"])
    assert where.endswith(".stages.jsonl") and not r.exists(completion.key(record["run_id"], ":finished"))
    counted = completion.counted(r, record["run_id"])
    by_video: dict[str, list[dict]] = {}
    for e in logged:
        by_video.setdefault(e["video"], []).append(e)
    spans = sorted(
        (min(e["start"] for e in found), max(e["end"] for e in found))
        for vid, found in by_video.items()
        if vid in summary["done_videos"]
    )
    assert len(spans) == good
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), spans
    assert progress.read(r, record["run_id"]).get("aggregate.done") == 1

    # The last stage of a finished video delivered again after the run ended: dropped at its claim (the
    # run's end mark), it counts nothing and sends no second callback.
    from tasks.pipeline import STAGE_TASKS
    from tasks.run.dataset import build_jobs

    last = summary["done_videos"][0]
    entry = next(e for e in manifest.read(out)["videos"] if e["video_id"] == last)
    assert entry["status"] == "done"  # from the run's outcomes file
    job = build_jobs([entry], raw, out, record["run_id"])[0][0]
    STAGE_TASKS[job.chain[-1]].apply_async((job.to_dict(),))
    wait_until(lambda: not waiting(r) and not r.hlen("unacked"), 120, "the repeated last stage taken and acked")
    assert progress.read(r, record["run_id"]).get("aggregate.done") == 1
    assert completion.counted(r, record["run_id"]) == counted  # nothing counted after the run's end
    assert not outcome_files.live_dir(out, record["run_id"]).exists()  # nor written
    logs = " ".join(p.read_text(errors="replace") for p in workers.logs.glob("*.log"))
    assert f"its run {record['run_id']} has ended" in logs


def test_the_statistics_full_pass_reads_the_partials_files_and_falls_back_to_the_markers(
    video_factory, workers, pipeline_env, tmp_path, monkeypatch
):
    raw = video_factory(3)
    workers.start("cpu")
    workers.start("gpu0")
    out = tmp_path / "out"
    done = run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=pipeline_env, timeout_s=400)
    assert done.returncode == 0, done.stdout + done.stderr

    configure_for(monkeypatch, pipeline_env["REDIS_URL"])
    from tasks.cli.verify import verify
    from tasks.statistics import partials, stats_file

    r = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)
    ids = sorted(p.stem for p in out.glob("*.hdf5"))
    assert not r.exists(partials.redis_key(out))  # no copy in Redis: the run's sums are there (tasks.statistics.sums)
    # The workers appended each video's entry to their segments in OUT/markers/partials/.
    assert sorted(partials.read_file(out)) == ids and partials.segments(out)
    segments = out / "markers" / partials.SEGMENTS
    segments.rename(tmp_path / "segments")
    markers_only = tmp_path / "markers-only.yaml"
    assert stats_file.write_statistics(out, "3d", None) == 3
    (out / "normalization_stats.yaml").rename(markers_only)
    (tmp_path / "segments").rename(segments)

    def statistics() -> str:
        assert stats_file.write_statistics(out, "3d", r) == 3
        assert verify(out) == []
        return (out / "normalization_stats.yaml").read_text()

    # Every entry current, in the segments or in partials.bin: no marker is read.
    real_read_done = stats_file.read_done
    monkeypatch.setattr(stats_file, "read_done", lambda *a, **k: pytest.fail(f"marker read: {a}"))
    assert statistics() == markers_only.read_text()
    entries = partials.read_file(out)
    partials.save(out, entries, partials.segments(out))
    assert partials.segments(out) == [] and sorted(partials.read_file(out)) == ids
    assert statistics() == markers_only.read_text()
    monkeypatch.setattr(stats_file, "read_done", real_read_done)

    # Partial (one entry gone) and stale (an output redone since its entry: other mtime, other
    # numbers): each such video's statistics come from its marker.
    size, mtime_ns, kind = partials.HEADER.unpack_from(entries[ids[1]])
    row = entries[ids[1]][partials.HEADER.size :]
    doubled = np.frombuffer(row, dtype="<f8").copy()
    doubled[0] *= 2  # the displacement count
    stale = {ids[1]: partials.HEADER.pack(size, mtime_ns - 1, kind) + doubled.tobytes(), ids[2]: entries[ids[2]]}
    partials.save(out, stale)
    assert statistics() == markers_only.read_text()
    partials.file_path(out).unlink()  # no file at all
    assert statistics() == markers_only.read_text()

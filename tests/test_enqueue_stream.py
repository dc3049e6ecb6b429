"""The enqueue as a stream: the walk's order, the first chain before the walk ends, the held videos'
compact form and their hand-off, the run's size recorded last, and an enqueuer killed mid-walk.

Real Redis throughout; real `celery worker` processes and real videos where a run must finish.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT, run_script, task_result, wait_until
from tests.test_completion import waiting


def names(tmp_path: Path) -> Path:
    """A folder whose names sort differently as strings and as path parts, with non-videos beside."""
    raw = tmp_path / "raw"
    for rel in (
        "a.mp4",
        "a/z.mp4",
        "a-b/c.MP4",
        "a.b/c.mov",
        "b/.hidden.mkv",
        "b/c/d/e.webm",
        "b/c.avi",
        "b/notes.txt",
        "b/.mp4",
        "Z.mp4",
        "10.mp4",
        "9.mp4",
    ):
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        (raw / rel).write_bytes(b"x" * len(rel))
    (raw / "b" / "folder.mp4").mkdir()  # a folder named like a video is walked, not taken
    (raw / "b" / "folder.mp4" / "in.mp4").touch()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "outside.mp4").touch()
    (raw / "linked").symlink_to(tmp_path / "elsewhere")  # a link to a folder is not followed (as rglob)
    return raw


def test_the_walk_yields_every_video_in_sorted_path_order_with_its_size(tmp_path):
    from tasks.run.listing import walk_videos

    raw = names(tmp_path)
    old_way = sorted(
        (p for p in raw.rglob("*") if p.is_file() and p.suffix.lower() in {".mp4", ".mov", ".mkv", ".webm", ".avi"}),
        key=lambda p: p.parts,
    )
    walked = list(walk_videos(raw))
    assert [f.path for f in walked] == [p.relative_to(raw).as_posix() for p in old_way]
    assert [f.bytes for f in walked] == [p.stat().st_size for p in old_way]
    assert "a/z.mp4" in [f.path for f in walked] and "linked/outside.mp4" not in [f.path for f in walked]


def test_the_first_chain_is_sent_before_the_walk_ends(app_on_test_redis, tmp_path, monkeypatch):
    conf, r = app_on_test_redis
    from tasks.cli import enqueue as cli
    from tasks.run.dataset import first_video

    raw = tmp_path / "raw"
    for shard in range(3):
        (raw / f"s{shard}").mkdir(parents=True)
        for i in range(200):
            (raw / f"s{shard}" / f"v{i:04d}.mp4").touch()
    seen: list[int] = []  # messages waiting each time the walk gives a video

    def watched(folder: Path):
        for found in first_video(folder):
            seen.append(len(waiting(r)))
            yield found

    monkeypatch.setattr(cli, "first_video", watched)
    record = cli.enqueue(conf, raw, tmp_path / "out", window=4)
    assert record["videos"] == len(seen) == 600
    assert seen[4] == 4  # the window's four chains wait while the walk is at its fifth video of 600
    assert len(waiting(r)) == 4 and cli.completion.pending_count(r, record["run_id"]) == 596


def test_a_run_cancelled_while_its_folder_is_walked_holds_nothing_and_stays_cancelled(
    app_on_test_redis, tmp_path, monkeypatch
):
    conf, r = app_on_test_redis
    from tasks.cli import cancel as cancel_cli
    from tasks.cli import enqueue as cli
    from tasks.run import runs
    from tasks.run.dataset import first_video

    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(700):
        (raw / f"v{i:04d}.mp4").touch()
    out = tmp_path / "out"

    def cancelled_at_300(folder: Path):
        for n, found in enumerate(first_video(folder)):
            if n == 300:
                assert cancel_cli.main([str(runs.latest(out)["run_id"])]) == 0  # framefleet cancel RUN
            yield found

    monkeypatch.setattr(cli, "first_video", cancelled_at_300)
    record = cli.enqueue(conf, raw, out, window=4)
    assert cli.completion.pending_count(r, record["run_id"]) == 0  # none held to be sent later
    assert not r.exists(f"ff:run:{record['run_id']}:pending")
    assert runs.read(out, record["run_id"])["status"] == "cancelled"  # not "running" again once walked


def test_a_held_video_costs_a_few_bytes_and_comes_back_as_the_same_job(app_on_test_redis, tmp_path):
    conf, r = app_on_test_redis
    from tasks.cli.enqueue import enqueue
    from tasks.run import pending, seal
    from tasks.run.dataset import build_jobs, find_videos, video_id

    raw = tmp_path / "raw"
    for shard in range(16):
        (raw / f"camera_{shard:02d}").mkdir(parents=True)
        for i in range(250):
            (raw / f"camera_{shard:02d}" / f"episode_{i:05d}_take1.mp4").touch()
    record = enqueue(conf, raw, tmp_path / "out", window=8)
    run_id, held = record["run_id"], record["videos"] - 8
    stored = r.memory_usage(pending.hash_key(run_id), samples=0) + (
        r.memory_usage(pending.bits_key(run_id), samples=0) or 0
    )
    # A job JSON in a field: ~440 B; its id and path ~28 B, and its seal (tasks.run.seal) 12 B that do not compress.
    assert stored / held < 44, f"{stored / held:.1f} B per held video"
    videos = find_videos(raw)
    entries = [{"video_id": video_id(v.relative_to(raw)), "path": v.relative_to(raw).as_posix()} for v in videos]
    jobs, _ = build_jobs(entries, raw, tmp_path / "out", run_id, intermediates=record["intermediates"])
    key = seal.read_key(tmp_path / "out", run_id)
    assert key is not None
    jobs = [seal.sealed(key, job) for job in jobs]  # each held video comes back with the seal enqueue gave it
    for index in (0, 255, 256, 2000, held - 1):
        assert pending.take(r, run_id, index) == jobs[8 + index], index
    assert pending.take(r, run_id, held) is None


def test_held_videos_are_sent_once_each_in_order_and_their_chunks_go(app_on_test_redis, tmp_path):
    conf, r = app_on_test_redis
    from tasks.run import completion, pending
    from tasks.run.dataset import build_jobs

    entries = [{"video_id": f"v{i}", "path": f"v{i}.mp4", "text": "t" if i == 300 else ""} for i in range(600)]
    jobs, _ = build_jobs(entries, tmp_path, tmp_path / "out", "run1")
    completion.hold(r, "run1", jobs, 3600)
    assert completion.pending_count(r, "run1") == 600 and r.hexists(pending.hash_key("run1"), "c0")
    for index in range(600):
        assert completion.send_pending(r, "run1", index, 3600)
        assert not completion.send_pending(r, "run1", index, 3600)  # a redelivered finishing task: no second send
    sent = [json.loads(raw)["video_id"] for raw in r.hvals(completion.sent_key("run1"))]
    assert sorted(sent) == sorted(e["video_id"] for e in entries) and len(waiting(r)) == 600
    assert completion.pending_count(r, "run1") == 0
    assert not r.hexists(pending.hash_key("run1"), "c0") and not r.hexists(pending.hash_key("run1"), "c1")
    assert completion.drop_pending(r, "run1") == 0


def test_a_video_due_before_it_was_held_is_sent_by_the_enqueuer(app_on_test_redis, tmp_path):
    """Workers faster than the walk: the k-th finish found no pending video k-1; the enqueuer sends it."""
    conf, r = app_on_test_redis
    from tasks import keys
    from tasks.run import completion, pending
    from tasks.run.dataset import build_jobs

    jobs, _ = build_jobs([{"video_id": f"v{i}", "path": f"v{i}.mp4"} for i in range(10)], tmp_path, tmp_path, "run2")
    r.hset(keys.RUN_PREFIX + "run2" + keys.RUN_TALLY_SUFFIX, "videos", 3)  # three window videos ended already
    for index in range(3):
        assert not completion.send_pending(r, "run2", index, 3600)  # their finishing tasks found nothing held
    holder = completion.holder_of(r, "run2", pending.shared_part(jobs[0]), 3600)
    for job in jobs:
        holder.add(job)
    assert holder.close() == 10
    assert sorted(json.loads(raw)["video_id"] for raw in r.hvals("ff:run:run2:sent")) == ["v0", "v1", "v2"]
    assert pending.count(r, "run2") == 7


def test_a_run_ends_only_once_its_size_is_known(app_on_test_redis, tmp_path):
    conf, r = app_on_test_redis
    from tasks.run import completion, runs
    from tasks.run.dataset import build_jobs

    jobs, run = build_jobs([{"video_id": "v0", "path": "v0.mp4"}], tmp_path, tmp_path / "out", "run3")
    record = {**run, "videos": None, "callback_id": "callback-3"}  # still walking the folder
    runs.publish(r, record, 3600)
    completion.video_ended(r, jobs[0], 3600)
    assert waiting(r) == []  # one video finished of a run whose size is not known: no end
    assert completion.listed(r, {**record, "videos": 1}, 3600)  # the walk ended: 1 video, 1 finished
    assert waiting(r) == [("framefleet.aggregate", "callback-3")]
    completion.video_ended(r, jobs[0], 3600)
    assert not completion.listed(r, {**record, "videos": 1}, 3600) and len(waiting(r)) == 1


def test_a_manifest_is_merged_in_one_pass_keeping_what_runs_recorded(tmp_path):
    from tasks.records import lineage, manifest
    from tasks.run.dataset import write_manifest
    from tasks.run.listing import walk_videos

    raw, out = names(tmp_path), tmp_path / "out"
    videos = [raw / f.path for f in walk_videos(raw)]
    write_manifest(raw, out, videos[::2], "run-1")
    first = json.loads((out / "manifest.json").read_text())
    done = first["videos"][0]["video_id"]
    first["videos"][0].update(status="done", quality={"q": 1})
    lineage.write(out, first, first["videos"])  # what the statistics callback records
    entries = write_manifest(raw, out, videos, "run-2")
    assert [e["path"] for e in entries] == [v.relative_to(raw).as_posix() for v in videos]
    after = json.loads((out / "manifest.json").read_text())
    assert [e["path"] for e in after["videos"]] == [e["path"] for e in entries]  # each video once, in order
    assert next(e for e in after["videos"] if e["video_id"] == done)["status"] == "done"
    assert manifest.head(out) == {k: v for k, v in after.items() if k != "videos"}
    assert after["last_run"] == "run-2" and after["roots"] == [str(raw.resolve())]
    assert not list((out / "runs").glob(".manifest.json.*"))


def test_a_runs_outcomes_are_read_with_the_manifest_and_folded_into_it_by_the_next_enqueue(tmp_path):
    """Each finishing task appends its video's status, quality and provenance to the run's outcomes files
    (OUT/runs/<run>.outcomes.live/), not to the manifest; once the run's end has put the folder in place every
    reader sees them merged (an earlier version's one file per run too); the next enqueue writes them into the
    manifest and names the run in its head, so files left behind (their removal failed) are not merged again."""
    from tasks.records import lineage, manifest, outcome_files
    from tasks.run.dataset import write_manifest
    from tasks.run.listing import walk_videos

    raw, out = names(tmp_path), tmp_path / "out"
    videos = [raw / f.path for f in walk_videos(raw)]
    write_manifest(raw, out, videos, "run-1")
    before = (out / "manifest.json").read_text()
    ids = [e["video_id"] for e in json.loads(before)["videos"]]
    prov = {"backends": {"depth": "x"}, "settings_sha256": "s1", "framefleet": {"version": "1"}, "run_id": "run-1"}
    made = {"quality": {"q": 1}, "provenance": {**prov, "source": {"sha256": "abc"}}}
    outcome_files.append(out, "run-1", ids[0], "done", made)
    outcome_files.append(out, "run-1", ids[1], "low_quality", {"quality": {"q": 0}, "shortfalls": ["hands"]})
    outcome_files.append(out, "run-1", ids[2], "failed", {})

    def status(entries: list[dict]) -> dict[str, str | None]:
        return {e["video_id"]: e.get("status") for e in entries}

    assert set(status(manifest.read(out)["videos"]).values()) == {None}  # a live run's lines: not merged yet
    outcome_files.close(out, "run-1", [])
    assert (out / "manifest.json").read_text() == before  # the manifest itself is not rewritten
    segment = next((out / "runs" / "run-1.outcomes").glob("*.jsonl"))
    segment.open("a").write(f'{ids[3]}\t{{"status": "do')  # a torn last line
    (out / "runs" / "run-0.outcomes.jsonl").write_text(f'{ids[4]}\t{{"status": "failed"}}\n')  # an earlier version's

    want = {ids[0]: "done", ids[1]: "low_quality", ids[2]: "failed", ids[4]: "failed"}
    want = {vid: want.get(vid) for vid in ids}
    assert status(manifest.read(out)["videos"]) == want
    assert status([json.loads(line) for line in manifest.lines(out)]) == want
    done = next(e for e in manifest.read(out)["videos"] if e["video_id"] == ids[0])
    assert done["quality"] == {"q": 1} and done["provenance"]["source_sha256"] == "abc"
    sets = lineage.backend_sets(out)
    assert sets == [{"backends": {"depth": "x"}, "settings_sha256": "s1", "framefleet": "1", "videos": 1}]

    write_manifest(raw, out, videos, "run-2")  # the next enqueue (a --continue)
    head = manifest.head(out)
    assert head["folded"] == ["run-0", "run-1"] and not list((out / "runs").glob("run-[01].outcomes*"))
    assert status(json.loads((out / "manifest.json").read_text())["videos"]) == want  # in the file itself now
    assert not manifest.outcomes(out) and lineage.backend_sets(out) == sets

    # Files left behind (their removal failed) are named in the head: not merged over a later run's record.
    outcome_files.append(out, "run-1", ids[0], "failed", {})
    outcome_files.close(out, "run-1", [])
    outcome_files.append(out, "run-3", ids[3], "failed", {})
    outcome_files.close(out, "run-3", [])
    assert status(manifest.read(out)["videos"]) == {**want, ids[3]: "failed"}
    write_manifest(raw, out, videos, "run-4")  # run 1's folder is still there: still named, so still not merged
    assert manifest.head(out)["folded"] == ["run-1", "run-3"]
    assert status(manifest.read(out)["videos"]) == {**want, ids[3]: "failed"}


def test_a_status_a_later_run_changes_is_the_later_runs_in_both_readers_and_in_the_folded_file(tmp_path):
    """A video failed in run 1 (folded into manifest.json by run 2's enqueue) and done in run 2: the manifest's
    older line never wins over the newer run's outcome, whether read whole, as lines, or folded by run 3."""
    from tasks.records import manifest, outcome_files
    from tasks.run.dataset import write_manifest
    from tasks.run.listing import walk_videos

    raw, out = names(tmp_path), tmp_path / "out"
    videos = [raw / f.path for f in walk_videos(raw)]
    write_manifest(raw, out, videos, "run-1")
    vid, other = (e["video_id"] for e in json.loads((out / "manifest.json").read_text())["videos"][:2])
    outcome_files.append(out, "run-1", vid, "failed", {})
    outcome_files.append(out, "run-1", other, "done", {"quality": {"q": 1}})
    outcome_files.close(out, "run-1", [{"video_id": vid}])
    write_manifest(raw, out, videos, "run-2")  # folds run 1: the file itself says "failed" now

    def file_status() -> dict[str, str | None]:
        return {e["video_id"]: e.get("status") for e in json.loads((out / "manifest.json").read_text())["videos"]}

    assert (file_status()[vid], manifest.head(out)["folded"]) == ("failed", ["run-1"])
    outcome_files.append(out, "run-2", vid, "done", {"quality": {"q": 2}})
    outcome_files.close(out, "run-2", [])
    whole = {e["video_id"]: e for e in manifest.read(out)["videos"]}
    streamed = {e["video_id"]: e for e in map(json.loads, manifest.lines(out))}
    for seen in (whole, streamed):
        assert (seen[vid]["status"], seen[vid]["quality"]) == ("done", {"q": 2}), seen[vid]
        assert (seen[other]["status"], seen[other]["quality"]) == ("done", {"q": 1}), seen[other]
    write_manifest(raw, out, videos, "run-3")  # folds run 2 over run 1's line
    assert (file_status()[vid], file_status()[other]) == ("done", "done")
    assert manifest.read(out)["videos"] == json.loads((out / "manifest.json").read_text())["videos"]


KILLED_MID_WALK = """
import os, signal, sys
sys.argv = ["framefleet", *sys.argv[1:]]
from tasks.cli import enqueue as cli
walk = cli.first_video
def dies_after_two(folder):
    for n, found in enumerate(walk(folder)):
        if n == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        yield found
cli.first_video = dies_after_two
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.timeout(900)
def test_an_enqueuer_killed_mid_walk_loses_nothing_on_continue(video_factory, workers, pipeline_env, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for clip in sorted(video_factory(4).iterdir()):
        shutil.copy(clip, raw / clip.name)
    workers.start("cpu")
    workers.start("gpu0")
    out = tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MID_WALK, str(raw), "--out", str(out), "--window", "1", "--no-wait"],
        cwd=ROOT,
        env=pipeline_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stdout + killed.stderr
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert record["videos"] is None  # its size was never recorded: this run cannot end by itself
    assert not (out / "manifest.json").exists()  # only its part, in OUT/runs/, which the next run removes
    wait_until(lambda: len(list(out.glob("*.hdf5"))) == 1, 300, "the one video sent before the kill")
    again = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--continue", env=pipeline_env)
    assert again.returncode == 0, again.stdout + again.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["already_complete"] == 1 and summary["videos"] == summary["done"] == 3
    assert len(list(out.glob("*.hdf5"))) == 4 and summary["statistics_videos"] == 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(e["path"] for e in manifest["videos"]) == sorted(p.name for p in raw.iterdir())
    assert not list((out / "runs").glob(".manifest.json.*"))
    assert task_result(pipeline_env["REDIS_URL"], record["callback_id"]) is None  # the killed run never ended
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)
    assert r.hget(f"ff:run:{record['run_id']}:tally", "videos") == "1"

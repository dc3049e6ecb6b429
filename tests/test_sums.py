"""A run's running sums of partial statistics (tasks.statistics.sums): exact, merged once per video whatever is
delivered twice, never used when a merge was lost, and a few tens of bytes per video in Redis.

Real Redis throughout (its Lua does the merge); the end-to-end test runs real `celery worker`
processes over real videos and compares with the full pass over the real files' markers.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import redis
import yaml

from tests.conftest import run_script

RTOL = 1e-12


def random_partial(rng: np.random.Generator, scale: float) -> dict:
    """A video's partial of a 3d run from random samples (sizes and magnitudes vary per video)."""
    from tasks.statistics.stats import Moments, VideoStats

    def m(n: int, dim: int, shift: float) -> Moments:
        return Moments.from_samples(rng.normal(shift, scale, size=(n, dim)))

    n = int(rng.integers(0, 400))
    return VideoStats(
        "3d", m(n, 3, 0.1), m(n, 1, 2.0), m(n // 4, 9, 0.5), m(n // 2, 3, 0.0), m(n // 2, 6, 0.0)
    ).to_dict()


def entry(partial: dict, size: int = 1000, mtime_ns: int = 1) -> bytes:
    from tasks.statistics import partials

    return partials.HEADER.pack(size, mtime_ns, b"3d") + partials.encode(partial, "3d")


def assert_close(got, want) -> None:
    """Two normalization_stats mappings agree: equal counts, every float within RTOL."""
    assert got.keys() == want.keys()
    for k in want:
        if isinstance(want[k], (list, float)):
            np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=0, err_msg=k)
        else:
            assert got[k] == want[k], k


def test_merging_in_any_order_with_duplicates_gives_one_pass(redis_url, app_on_test_redis):
    from tasks.statistics import sums
    from tasks.statistics.stats import VideoStats, normalization_stats

    _conf, r = app_on_test_redis
    rng = np.random.default_rng(7)
    parts = {f"v{i:04d}": random_partial(rng, scale=10.0 ** rng.integers(-3, 4)) for i in range(300)}
    shards = sums.shard_count(len(parts))
    order = list(parts)
    rng.shuffle(order)
    results = [sums.merge(r, "run1", shards, vid, entry(parts[vid]), 3600) for vid in order]
    assert results == [1] * len(parts)
    again = [sums.merge(r, "run1", shards, vid, entry(parts[vid]), 3600) for vid in order[:50]]
    assert again == [0] * 50  # redelivered: nothing added
    total, count = sums.pooled(sums.read(r, "run1"), "3d")
    assert count == len(parts)
    one_pass = VideoStats.pool([parts[v] for v in sorted(parts)], "3d")
    assert total.displacement.count == one_pass.displacement.count
    assert_close(normalization_stats(total), normalization_stats(one_pass))


def test_concurrent_deliveries_of_one_video_merge_it_once(redis_url, app_on_test_redis):
    from tasks.statistics import sums

    _conf, r = app_on_test_redis
    part = random_partial(np.random.default_rng(1), 1.0)
    outcomes: list[int] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(sums.merge(r, "run1", 1, "v0", entry(part), 60)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == [0] * 7 + [1]
    assert sums.pooled(sums.read(r, "run1"), "3d")[1] == 1


def test_a_video_merged_again_with_another_file_turns_the_sums_off(redis_url, app_on_test_redis):
    from tasks.statistics import sums

    _conf, r = app_on_test_redis
    rng = np.random.default_rng(2)
    assert sums.merge(r, "run1", 1, "v0", entry(random_partial(rng, 1.0), mtime_ns=1), 60) == 1
    assert sums.merge(r, "run1", 1, "v0", entry(random_partial(rng, 1.0), mtime_ns=2), 60) == 2
    assert sums.pooled(sums.read(r, "run1"), "3d") is None  # the end pools every video instead


def test_the_marks_take_a_few_tens_of_bytes_per_video(redis_url, app_on_test_redis):
    """The memory shape, measured with MEMORY USAGE: the sums stay one small hash whatever the run's size,
    and the merged marks stay in the listpack encoding (not one hash-table entry per video)."""
    from tasks.statistics import sums

    _conf, r = app_on_test_redis
    part = entry(random_partial(np.random.default_rng(3), 1.0))

    def footprint(run_id: str, videos: int) -> tuple[int, int]:
        shards = sums.shard_count(videos)
        for i in range(videos):
            sums.merge(r, run_id, shards, f"clip_{i:07d}-0123456789", part, 3600)
        marks = [k for k in sums.shard_keys(run_id, shards) if r.exists(k)]
        assert {r.object("encoding", k) for k in marks} == {"listpack"}
        return r.memory_usage(sums.sums_key(run_id), samples=0), sum(r.memory_usage(k, samples=0) for k in marks)

    small_sums, _ = footprint("small", 100)
    big_sums, big_marks = footprint("big", 4000)
    assert big_sums == small_sums < 1024  # one row and one count, whatever the number of videos
    assert big_marks / 4000 < 64, big_marks / 4000  # the partials hash held ~520 B per video
    from tasks.run import completion

    pipe = r.pipeline()
    completion.let_go(pipe, "big", 1, 4000)
    pipe.execute()
    assert not any(r.exists(k) for k in sums.shard_keys("big", sums.shard_count(4000)))


def test_segments_are_read_newest_last_and_a_damaged_tail_is_skipped(tmp_path):
    from tasks.statistics import partials

    rng = np.random.default_rng(4)
    a, b = entry(random_partial(rng, 1.0), mtime_ns=1), entry(random_partial(rng, 1.0), mtime_ns=2)
    partials.save(tmp_path, {"v0": a, "v1": a})
    partials.append(tmp_path, "v1", b)  # remade since the file was written
    partials.append(tmp_path, "v2", b)
    (segment,) = partials.segments(tmp_path)
    with segment[0].open("ab") as f:
        f.write(partials.RECORD.pack(len(b), 2) + b[:10])  # a process killed mid-write
    assert partials.read_file(tmp_path) == {"v0": a, "v1": b, "v2": b}
    folded = partials.segments(tmp_path)
    partials.save(tmp_path, partials.read_file(tmp_path), folded)
    assert partials.segments(tmp_path) == [] and partials.read_file(tmp_path) == {"v0": a, "v1": b, "v2": b}


def test_a_run_ends_with_its_sums_equal_to_the_full_pass(video_factory, workers, pipeline_env, tmp_path, monkeypatch):
    """Real workers and videos: the run's end uses its sums (no video's partial read), and they give the
    statistics of the full pass over the markers to 1e-12; a duplicate, a lost merge and a flushed Redis
    leave the file as the full pass writes it."""
    raw = video_factory(4)
    workers.start("cpu")
    workers.start("gpu0")
    out = tmp_path / "out"
    done = run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=pipeline_env, timeout_s=400)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["statistics_from"] == "running sums" and summary["statistics_videos"] == 4
    from_sums = yaml.safe_load((out / "normalization_stats.yaml").read_text())

    monkeypatch.setenv("REDIS_URL", pipeline_env["REDIS_URL"])
    from tasks import configure
    from tasks.statistics import partials, stats_file, sums
    from worker_config.settings import load_settings

    configure(load_settings())
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)
    run_id = summary["run_id"]
    assert stats_file.write_statistics(out, "3d", None) == 4  # the full pass: every marker
    full = yaml.safe_load((out / "normalization_stats.yaml").read_text())
    assert_close(from_sums, full)
    kept = partials.read_file(out)  # the segments the workers appended: one entry per video
    assert sorted(kept) == sorted(p.stem for p in out.glob("*.hdf5"))

    # The run's sums again, merged in another order with every video delivered twice.
    shards = sums.shard_count(4)
    for vid in [*reversed(sorted(kept)), *sorted(kept)]:
        sums.merge(r, "again", shards, vid, kept[vid], 60)
    assert stats_file.write_statistics_from(out, "3d", r, None, "again") == (4, "running sums")
    assert_close(yaml.safe_load((out / "normalization_stats.yaml").read_text()), full)

    # The h5 stage's hook, delivered twice per video (the second finds its output made and reports the
    # marker's statistics, as a redelivery does): each video merged once, its entry appended again.
    from tasks.job import Job
    from tasks.outputs.stage_io import dataset_file
    from tasks.pipeline.hooks import StageCall
    from tasks.pipeline.keep_partials import KeepPartials
    from tasks.stages import dataset_stage

    hook = KeepPartials()
    for vid in [*sorted(kept), *sorted(kept)]:
        job = Job(run_id="hooked", video_id=vid, output_root=str(out))
        report = json.loads(dataset_file(out, vid)[1].read_text())["report"]
        hook.after_success(StageCall(task=None, stage_name=dataset_stage().name, given=job, job=job, report=report))
    assert sums.pooled(sums.read(r, "hooked"), "3d")[1] == 4
    assert stats_file.write_statistics_from(out, "3d", r, None, "hooked") == (4, "running sums")
    assert_close(yaml.safe_load((out / "normalization_stats.yaml").read_text()), full)

    # A worker killed between the marker and the merge: the sums hold 3 of 4 videos; the end pools all.
    for vid in sorted(kept)[1:]:
        sums.merge(r, "lost", shards, vid, kept[vid], 60)
    assert stats_file.write_statistics_from(out, "3d", r, None, "lost") == (4, "every video")
    assert yaml.safe_load((out / "normalization_stats.yaml").read_text()) == full
    # Redis flushed before the end, and no saved sums of an earlier end (a run that merged nothing then
    # takes the saved sums when they cover every marker: test_saved_sums_...): the same.
    sums.file_path(out).unlink()
    r.flushdb()
    assert stats_file.write_statistics_from(out, "3d", r, None, run_id) == (4, "every video")
    assert yaml.safe_load((out / "normalization_stats.yaml").read_text()) == full


@pytest.mark.parametrize("videos", [1, 64, 65, 1_000_000, 100_000_000])
def test_shards_hold_about_64_videos(videos):
    from tasks.statistics import sums

    shards = sums.shard_count(videos)
    assert shards & (shards - 1) == 0 and shards <= sums.MAX_SHARDS
    assert videos / shards <= sums.PER_SHARD or shards == sums.MAX_SHARDS


def test_the_sums_key_is_named_once():
    from tasks import keys
    from tasks.statistics import sums

    assert sums.sums_key("r").endswith(keys.RUN_SUMS_SUFFIX)
    assert Path(sums.shard_key("r", b"\0" * 8, 4)).name.startswith(keys.RUN_PREFIX + "r" + keys.RUN_MERGED_SUFFIX)


def test_the_markers_are_counted_as_marked_videos_lists_them(tmp_path):
    from tasks.outputs.stage_io import MARKER_SUFFIX, marked_videos, marker_shard
    from tasks.statistics import partials, sums

    for vid in ("a", "b", "c"):
        shard = tmp_path / "markers" / marker_shard(vid)
        shard.mkdir(parents=True, exist_ok=True)
        (shard / (vid + MARKER_SUFFIX)).write_text("{}")
    (tmp_path / "markers" / ("old" + MARKER_SUFFIX)).write_text("{}")  # an earlier version's place
    (tmp_path / "markers" / marker_shard("a") / "a.hdf5.done.json.tmp123").write_text("")  # a write under way
    partials.append(tmp_path, "a", entry(random_partial(np.random.default_rng(5), 1.0)))
    assert sums.count_markers(tmp_path) == len(marked_videos(tmp_path)) == 4


def test_outcomes_are_kept_small_and_read_back_whole(redis_url, app_on_test_redis):
    """An outcome deflated against the run's first one reads back as it was (stage times to the ms),
    takes a fraction of its JSON, and one deflated against another dictionary is refused, not misread."""
    from tasks.records import outcomes

    _conf, r = app_on_test_redis
    report = {"provenance": {"backends": {"depth": "synthetic"}, "settings_sha256": "ab" * 32}, "quality": {"x": 1}}

    def outcome(i: int) -> dict:
        timings = {
            s: {"start": 1e9 + i + k, "end": 1e9 + i + k + 0.5, "worker": "w1", "skipped": False}
            for k, s in enumerate("abcde")
        }
        return {"video_id": f"v{i}", "video": f"v{i}.mp4", "timings": timings, "report": report}

    packed = [outcomes.encode(r, "run1", outcome(i), 60) for i in range(20)]
    for i, value in enumerate(packed):
        r.hset("ff:run:run1:finished", f"v{i}", value)
    assert sorted(outcomes.read(r, "run1", batch=7)) == sorted((f"v{i}", outcome(i)) for i in range(20))
    assert max(len(v) for v in packed[1:]) < len(json.dumps(outcome(1))) / 3
    import zlib

    foreign = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, b"another dictionary")
    with pytest.raises(ValueError):  # deflated against a dictionary the run does not hold: refused
        outcomes.decode(outcomes.PACKED + b"12345678" + foreign.compress(b"{}") + foreign.flush(), {})
    # Redis flushed mid-run: this process's dictionary is set again with the next outcome, so it reads.
    r.flushdb()
    r.hset("ff:run:run1:finished", "v20", outcomes.encode(r, "run1", outcome(20), 60))
    assert list(outcomes.read(r, "run1")) == [("v20", outcome(20))]


def complete_videos(out: Path, rng: np.random.Generator, names: list[str]) -> dict[str, dict]:
    """Videos complete in ``out`` as a run leaves them: an output file, its marker in its shard, its entry
    in this process's segment of OUT/markers/partials/; their partials by id."""
    from tasks.outputs.stage_io import MARKER_SUFFIX, marker_shard
    from tasks.statistics import partials

    made = {}
    out.mkdir(parents=True, exist_ok=True)
    for vid in names:
        made[vid] = random_partial(rng, float(rng.uniform(0.5, 3.0)))
        (out / f"{vid}.hdf5").write_bytes(vid.encode() * 10)
        shard = out / "markers" / marker_shard(vid)
        shard.mkdir(parents=True, exist_ok=True)
        (shard / (vid + MARKER_SUFFIX)).write_text("{}")
        partials.append(out, vid, partials.entry_of(out / f"{vid}.hdf5", made[vid]))
    return made


def merge_run(r, run_id: str, out: Path, names: list[str]) -> None:
    from tasks.statistics import partials, sums

    kept = partials.read_file(out)
    for vid in names:
        sums.merge(r, run_id, 1, vid, kept[vid], 60)


def one_pass(made: dict[str, dict]) -> dict:
    from tasks.statistics.stats import normalization_stats, pool_rows, to_row

    return normalization_stats(pool_rows(np.stack([to_row(p, "3d") for p in made.values()]), "3d"))


def test_saved_sums_and_a_later_runs_sums_give_the_full_pass(redis_url, app_on_test_redis, tmp_path):
    """A --continue or --add over earlier videos: the end adds the sums the last end saved
    (OUT/markers/sums.json) to the run's own, and reads no video's partial; equal to one pass to 1e-12."""
    from tasks.statistics import stats_file, sums

    r = app_on_test_redis[1]
    rng = np.random.default_rng(11)
    out = tmp_path / "out"
    made = complete_videos(out, rng, [f"v{i:03d}" for i in range(40)])
    merge_run(r, "first", out, sorted(made))
    assert stats_file.write_statistics_from(out, "3d", r, None, "first") == (40, "running sums")
    saved = json.loads(sums.file_path(out).read_text())
    assert saved["videos"] == 40 and saved["digest"] == list(sums.digest_of(made))

    added = complete_videos(out, rng, [f"w{i:03d}" for i in range(7)])
    merge_run(r, "second", out, [*reversed(sorted(added)), *sorted(added)])  # delivered twice: merged once
    got = stats_file.write_statistics_from(out, "3d", r, None, "second")
    assert got == (47, "running sums and earlier runs' sums")
    assert_close(yaml.safe_load((out / "normalization_stats.yaml").read_text()), one_pass({**made, **added}))
    assert json.loads(sums.file_path(out).read_text())["videos"] == 47

    # A --continue that made nothing new: the saved sums alone.
    assert stats_file.write_statistics_from(out, "3d", r, None, "third") == (47, "running sums and earlier runs' sums")
    assert_close(yaml.safe_load((out / "normalization_stats.yaml").read_text()), one_pass({**made, **added}))
    assert stats_file.write_statistics(out, "3d", None) == 47  # the full pass (no run): the same
    assert_close(yaml.safe_load((out / "normalization_stats.yaml").read_text()), one_pass({**made, **added}))


def test_saved_sums_that_do_not_cover_the_markers_exactly_take_the_full_pass(
    redis_url, app_on_test_redis, tmp_path, caplog
):
    """The full pass, and a log line saying why, when the saved sums plus the run's do not hold OUT's
    markers once each: as many videos but not the same ones, a video redone in the later run, a saved
    file of another track type."""
    from tasks.outputs.stage_io import MARKER_SUFFIX, marker_shard
    from tasks.statistics import stats_file, sums

    r = app_on_test_redis[1]
    rng = np.random.default_rng(12)
    out = tmp_path / "out"
    made = complete_videos(out, rng, [f"v{i:03d}" for i in range(20)])
    merge_run(r, "first", out, sorted(made))
    assert stats_file.write_statistics_from(out, "3d", r, None, "first") == (20, "running sums")
    saved = sums.file_path(out).read_text()

    # One video's output removed by hand, and a new video whose merge was lost (its worker killed between
    # its marker and the merge): 20 markers, as many as the saved sums hold, but not the same videos.
    gone = sorted(made)[3]
    (out / "markers" / marker_shard(gone) / (gone + MARKER_SUFFIX)).unlink()
    (out / f"{gone}.hdf5").unlink()
    added = complete_videos(out, rng, ["new"])
    caplog.set_level("INFO", logger="framefleet.sums")
    assert stats_file.write_statistics_from(out, "3d", r, None, "second") == (20, "every video")
    assert "not the same ones" in caplog.text
    left = {vid: p for vid, p in {**made, **added}.items() if vid != gone}
    assert_close(yaml.safe_load((out / "normalization_stats.yaml").read_text()), one_pass(left))

    # A video of the saved sums made again in the later run: counted twice there, so the full pass.
    sums.file_path(out).write_text(saved)
    again = complete_videos(out, rng, [sorted(made)[0]])  # its file and partial replaced
    merge_run(r, "third", out, list(again))
    caplog.clear()
    assert stats_file.write_statistics_from(out, "3d", r, None, "third") == (20, "every video")
    assert "pooling every video's partial" in caplog.text
    assert_close(yaml.safe_load((out / "normalization_stats.yaml").read_text()), one_pass({**left, **again}))

    # Saved sums of another track type: not used.
    other = json.loads(sums.file_path(out).read_text())
    sums.file_path(out).write_text(json.dumps({**other, "track_type": "2d"}))
    assert stats_file.write_statistics_from(out, "3d", r, None, "fourth") == (20, "every video")

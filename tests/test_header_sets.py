"""The statistics file's header at a run's end: the backend sets of OUT's done videos from the run's counters
and the sets saved beside the earlier runs' sums, without the manifest's pass, and the pass when those do not
cover exactly the manifest's done videos: the header is the one the pass writes either way (real Redis, real
files, the real callback)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import redis

from tests.test_completion import configure_for
from tests.test_sums import complete_videos

SET_A = {"backends": {"depth": "synthetic", "hands": "builtin"}, "settings_sha256": "a" * 64}
SET_B = {"backends": {"depth": "other", "hands": "builtin"}, "settings_sha256": "b" * 64}


def _report(prov: dict, vid: str) -> dict:
    full = {**prov, "framefleet": {"version": "9.9"}, "source": {"sha256": vid * 4}, "run_id": "any"}
    return {"quality": {"q": 1}, "provenance": full}


def _header(out: Path) -> list[str]:
    return [line for line in (out / "normalization_stats.yaml").read_text().splitlines() if line.startswith("#")]


def _pass_header(out: Path) -> list[str]:
    """The header as the manifest's pass writes it (``stats_header`` reading the sets itself)."""
    from tasks.statistics import stats_file
    from tasks.statistics.stats import write_stats_yaml

    probe = out / "probe.yaml"
    write_stats_yaml(probe, {"count": 0}, stats_file.stats_header(out))
    found = [line for line in probe.read_text().splitlines() if line.startswith("#")]
    probe.unlink()
    return found


def _end_run(
    r: redis.Redis, out: Path, run_id: str, every: list[str], ends: dict[str, dict | None], tmp_path: Path
) -> dict:
    """A run over ``ends``' videos (a report: done; None: failed) in an OUT whose manifest lists ``every`` video:
    each done video complete (file, marker, partial) and merged into the run's sums, each video ended as its last
    task ends it, then the real callback. Returns the summary."""
    from tasks.job import Failure
    from tasks.records import lineage
    from tasks.run import aggregate, completion, runs
    from tasks.run.dataset import build_jobs
    from tasks.statistics import sums

    lineage.write(out, {"order": "parts"}, [{"video_id": v, "path": f"{v}.mp4"} for v in sorted(every)])
    done = [vid for vid, report in ends.items() if report is not None]
    complete_videos(out, np.random.default_rng(len(every)), done)
    from tasks.statistics import partials

    kept = partials.read_file(out)
    for vid in done:
        sums.merge(r, run_id, 1, vid, kept[vid], 60)
    jobs, run = build_jobs([{"video_id": v, "path": f"{v}.mp4"} for v in ends], tmp_path, out, run_id)
    record = {**run, "callback_id": f"callback-{run_id}"}
    runs.publish(r, record, 3600)
    broke = Failure("h5", "Boom", "disk", 3, "cpu@test", 5.0)
    for job in jobs:
        report = ends[job.video_id]
        completion.video_ended(r, replace(job, report=report) if report else replace(job, failed=broke), 3600)
    aggregate.aggregate.run(completion.callback_run(record))
    return dict(json.loads((out / "run_summary.json").read_text()))


def test_the_header_adds_the_runs_counters_to_the_saved_sets_and_equals_the_pass(
    redis_url, monkeypatch, tmp_path, caplog
):
    """A first run (two backend sets, a failed video), then a --continue that adds videos: each end's header
    comes from the counters (and the saved sets), not the manifest's pass, and is the pass's, line for line."""
    configure_for(monkeypatch, redis_url)
    from tasks.run import aggregate
    from tasks.statistics import sums

    monkeypatch.setattr(
        aggregate, "write_report", lambda out_root, table=None, child=None: None
    )  # the report is not under test here
    caplog.set_level("INFO", logger="framefleet.aggregate")
    r = redis.Redis.from_url(redis_url)
    out = tmp_path / "out"
    first = {f"v{i}": _report(SET_A, f"v{i}") for i in range(4)}
    first.update(v4=_report(SET_B, "v4"), v5=None)
    summary = _end_run(r, out, "first", list(first), first, tmp_path)
    assert summary["statistics_from"] == "running sums" and summary["statistics_videos"] == 5
    assert "backend sets from the manifest's pass" not in caplog.text
    header = _header(out)
    assert header == _pass_header(out)
    assert "#   4 videos: depth=synthetic; settings sha256 aaaaaaaaaaaaaaaa" in header
    assert "#   1 videos: depth=other; settings sha256 bbbbbbbbbbbbbbbb" in header
    assert json.loads(sums.file_path(out).read_text())["backend_sets"]["runs"] == ["first"]

    more = {f"w{i}": _report(SET_B, f"w{i}") for i in range(4)}
    summary = _end_run(r, out, "more", [*first, *more], more, tmp_path)
    assert summary["statistics_from"] == "running sums and earlier runs' sums" and summary["statistics_videos"] == 9
    assert "backend sets from the manifest's pass" not in caplog.text
    header = _header(out)
    assert header == _pass_header(out)
    assert header[-2:] == [
        "#   5 videos: depth=other; settings sha256 bbbbbbbbbbbbbbbb",
        "#   4 videos: depth=synthetic; settings sha256 aaaaaaaaaaaaaaaa",
    ]


def test_the_header_takes_the_pass_when_the_saved_sets_do_not_cover_the_done_videos(
    redis_url, monkeypatch, tmp_path, caplog
):
    """The manifest's pass, said in the log, and its header, when the saved sets and the run's are not the
    manifest's done videos: another run's outcomes since (a video of the saved sets now failed), a video of
    the saved sets failed in this run with its marker kept, no saved sets; and when two sets hold as many
    videos (the pass orders them by the manifest)."""
    configure_for(monkeypatch, redis_url)
    from tasks.records import manifest, outcome_files
    from tasks.run import aggregate

    monkeypatch.setattr(aggregate, "write_report", lambda out_root, table=None, child=None: None)
    caplog.set_level("INFO", logger="framefleet.aggregate")
    r = redis.Redis.from_url(redis_url)
    first = {f"v{i}": _report(SET_A, f"v{i}") for i in range(3)}
    first.update(v3=_report(SET_B, "v3"))

    def first_run(name: str) -> Path:
        out = tmp_path / name
        _end_run(r, out, f"first-{name}", list(first), first, tmp_path)
        assert "backend sets from the manifest's pass" not in caplog.text
        return out

    # Another run's outcomes reached OUT since (its end said v0 failed): the saved sets no longer hold.
    out = first_run("other")
    other = manifest.outcomes_path(out, "other")
    other.mkdir(parents=True)
    (other / "x.jsonl").write_text(outcome_files.line_of("v0", "failed", {}))
    more = {"w0": _report(SET_A, "w0")}
    summary = _end_run(r, out, "more-other", [*first, *more], more, tmp_path)
    assert summary["statistics_from"] == "running sums and earlier runs' sums"  # the sums count markers
    assert "outcomes of other runs since: other" in caplog.text
    header = _header(out)
    assert header == _pass_header(out)
    assert "#   3 videos: depth=synthetic; settings sha256 aaaaaaaaaaaaaaaa" in header  # v1, v2, w0

    # The pass's sets held fewer done videos than the sums (v0 failed, its marker kept): none saved for the
    # next end, which takes the pass again.
    caplog.clear()
    last = {"x0": _report(SET_A, "x0")}
    _end_run(r, out, "last-other", [*first, *more, *last], last, tmp_path)
    assert "no backend sets saved with the earlier runs' sums" in caplog.text
    assert _header(out) == _pass_header(out)

    # A video of the saved sets failed in this run, its marker kept: the pass (it is not done now).
    caplog.clear()
    out = first_run("failed")
    again = {"v1": None, "w1": _report(SET_B, "w1")}
    _end_run(r, out, "second-failed", [*first, "w1"], again, tmp_path)
    assert "v1 did not end done in this run but has a marker" in caplog.text
    header = _header(out)
    assert header == _pass_header(out)
    assert header[-2:] == [
        "#   2 videos: depth=synthetic; settings sha256 aaaaaaaaaaaaaaaa",
        "#   2 videos: depth=other; settings sha256 bbbbbbbbbbbbbbbb",
    ]

    # Two sets of as many videos: the pass orders them (by the manifest), not the counters.
    caplog.clear()
    out = first_run("tie")
    tie = {"w1": _report(SET_B, "w1"), "w2": _report(SET_B, "w2")}
    _end_run(r, out, "tie", [*first, *tie], tie, tmp_path)
    assert "two backend sets of as many videos" in caplog.text
    assert _header(out) == _pass_header(out)

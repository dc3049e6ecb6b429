"""The report's quality table from what a run's end read of its outcomes lines: the same videos and count as
the report's own pass over the manifest and the runs' outcomes, or that pass when the end's read cannot give
them (real files; real Redis and the real callback for the end)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from tests.test_completion import configure_for

QUALITY = {"tracks": {"visible_fraction": 0.5}, "depth": {"camera": "solved"}}


def _found(status: str, vid: str) -> dict:
    if status == "low_quality":
        return {
            "quality": QUALITY,
            "shortfalls": [{"stage": "tracks", "measure": vid, "value": 0.5, "setting": "s", "threshold": 0.6}],
        }
    if status == "done":
        return {"quality": {**QUALITY, "vid": vid}, "provenance": {"backends": {"depth": "synthetic"}, "run_id": "r"}}
    return {}


def _out(tmp_path: Path, run_id: str, manifest_entries: list[dict], segments: list[list[tuple[str, str]]]) -> Path:
    """An OUT whose manifest holds ``manifest_entries`` and whose run ``run_id`` is live with a segment of
    outcomes lines per list of (video id, status) in ``segments``."""
    from tasks.records import lineage, outcome_files

    out = tmp_path / "out"
    lineage.write(out, {"order": "parts"}, sorted(manifest_entries, key=lambda e: e["path"]))
    live = outcome_files.live_dir(out, run_id)
    live.mkdir(parents=True)
    for i, lines in enumerate(segments):
        text = "".join(outcome_files.line_of(vid, status, _found(status, vid)) for vid, status in lines)
        (live / f"host-{i}-0000000{i}.jsonl").write_text(text)
    return out


def _entries(count: int, **extra: dict) -> list[dict]:
    return [{"video_id": f"v{i:02d}", "path": f"v{i:02d}.mp4", **extra.get(f"v{i:02d}", {})} for i in range(count)]


@pytest.mark.parametrize("chunk_chars", [1 << 25, 300])
def test_the_table_from_the_ends_read_is_the_passs_whatever_the_lines_say(tmp_path, monkeypatch, chunk_chars):
    """Done, low_quality and failed videos, a video ended twice with other statuses (low then done; done then
    failed, the failure settled by Redis's record), a torn last line, manifest entries of no video of the run
    (with an earlier run's status folded in, and without any), read in whole or in chunks of a few lines."""
    from tasks.records import outcome_files
    from tasks.report import quality_table, report_quality

    monkeypatch.setattr(quality_table, "CHUNK_BYTES", chunk_chars)
    statuses = ["done", "low_quality", "done", "failed", "low_quality"]
    mine = [(f"v{i:02d}", statuses[i % 5]) for i in range(30) if i not in (7, 8)]
    earlier = {"v07": {"status": "low_quality", "quality": QUALITY, "shortfalls": []}, "v08": {"noun": "x"}}
    out = _out(tmp_path, "run", _entries(30, **earlier), [mine[::2], mine[1::2] + [("v02", "low_quality")]])
    live = outcome_files.live_dir(out, "run")
    with open(live / "host-0-00000000.jsonl", "a") as fh:
        fh.write(outcome_files.line_of("v00", "failed", {}) + 'v05\t{"status": "do')  # v00: done, then failed
    failed = [{"video_id": "v00", "video": "v00.mp4", "stage": "h5", "error_class": "Boom"}]
    failed += [{"video_id": v, "detail": _found(s, v)} for v, s in mine if s == "low_quality"]
    failed += [{"video_id": v} for v, s in mine if s == "failed"]
    for rows in (3, 5, 40):
        if (out / "runs" / "run.outcomes").exists():  # closed by the rows before: open it again
            (out / "runs" / "run.outcomes").rename(live)
            (live / outcome_files.END).unlink(missing_ok=True)
        _folder, lines = outcome_files.close(out, "run", failed, wanted=quality_table.wanted(out, 40))
        assert lines.status["v00"] == "failed" and lines.status["v02"] == "done"
        expected = report_quality.recorded(out, rows)
        assert quality_table.chosen(out, "run", lines, rows) == expected
        assert expected[1] == 29 and sum(e["status"] == "low_quality" for e in expected[0]) == 13  # v07: folded earlier


def test_the_table_is_left_to_the_pass_when_the_end_read_does_not_give_it(tmp_path):
    """Another run's outcomes merged over the manifest, and the first ``rows`` others of the manifest beyond
    the videos whose fields the end kept (many low_quality videos first): None, and the pass gives the table."""
    from tasks.records import outcome_files
    from tasks.report import quality_table, report_quality

    mine = [(f"v{i:02d}", "low_quality" if i < 8 else "done") for i in range(12)]
    out = _out(tmp_path, "run", _entries(12), [mine])
    _folder, lines = outcome_files.close(out, "run", [], wanted=quality_table.wanted(out, 3))
    assert quality_table.chosen(out, "run", lines, 3) is None  # v08..v10 shown, only v00..v05 kept
    _folder, lines = outcome_files.close(out, "run", [], wanted=quality_table.wanted(out, 6))  # read again
    assert quality_table.chosen(out, "run", lines, 6) == report_quality.recorded(out, 6)

    (out / "runs" / "other.outcomes").mkdir()
    (out / "runs" / "other.outcomes" / "a.jsonl").write_text(outcome_files.line_of("v09", "failed", {}))
    assert quality_table.chosen(out, "run", lines, 6) is None


def test_the_runs_end_gives_the_report_the_passs_table(redis_url, monkeypatch, tmp_path):
    """The real callback after real finishing tasks hands the report the table the report's pass finds, and
    the report written from it is the report written without it."""
    configure_for(monkeypatch, redis_url)
    from tasks.job import Failure
    from tasks.records import lineage
    from tasks.report import report, report_quality
    from tasks.run import aggregate, completion, runs
    from tasks.run.dataset import build_jobs

    given = []
    monkeypatch.setattr(aggregate, "write_report", lambda out_root, table=None, child=None: given.append(table))
    r = redis.Redis.from_url(redis_url)
    out = tmp_path / "out"
    entries = _entries(6)
    lineage.write(out, {"order": "parts"}, entries)
    jobs, run = build_jobs(entries, tmp_path, out, "run")
    record = {**run, "callback_id": "callback-run"}
    runs.publish(r, record, 3600)
    low = Failure("h5", "low_quality", "gate", 1, "cpu@test", 6.0, detail=_found("low_quality", "v01"))
    broke = Failure("h5", "Boom", "disk", 3, "cpu@test", 5.0)
    ends = [replace(job, report=_found("done", job.video_id)) for job in jobs]
    ends[1], ends[3] = replace(jobs[1], failed=low), replace(jobs[3], failed=broke)
    for job in ends:
        completion.video_ended(r, job, 3600)
    aggregate.aggregate.run(completion.callback_run(record))

    assert given and given[0] is not None
    videos, count = given[0]
    assert (videos, count) == report_quality.recorded(out) and count == 6
    assert [v["status"] for v in videos] == ["done", "low_quality", "done", "failed", "done", "done"]
    table_file = tmp_path / "table.json"
    table_file.write_text(json.dumps({"videos": videos, "count": count}))
    assert report.main([str(out), "--table", str(table_file)]) == 0
    table = report_quality.section(out, given[0])
    assert table == report_quality.section(out) and "v01.mp4" in table
    assert table in (out / "report.html").read_text()


def test_the_report_started_early_waits_for_the_table_and_writes_nothing_without_it(
    redis_url, monkeypatch, tmp_path, pipeline_env
):
    """The real callback starts the report's process before its work and hands it the table at the end: the
    page holds the pass's table. A report process whose end stopped (its input closed, or it was stopped)
    writes no page."""
    import subprocess
    import sys

    configure_for(monkeypatch, redis_url)
    from tasks.records import lineage
    from tasks.report import report_quality
    from tasks.run import aggregate, completion, runs
    from tasks.run.dataset import build_jobs

    r = redis.Redis.from_url(redis_url)
    out = tmp_path / "out"
    entries = _entries(3)
    lineage.write(out, {"order": "parts"}, entries)
    jobs, run = build_jobs(entries, tmp_path, out, "run")
    record = {**run, "callback_id": "callback-run"}
    runs.publish(r, record, 3600)
    for job in jobs:
        completion.video_ended(r, replace(job, report=_found("done", job.video_id)), 3600)
    aggregate.aggregate.run(completion.callback_run(record))
    page = (out / "report.html").read_text()
    assert report_quality.section(out) in page and "v02.mp4" in page

    (out / "report.html").unlink()
    cmd = [sys.executable, "-m", "tasks.report.report", str(out), "--table", "-"]
    done = subprocess.run(cmd, input="", capture_output=True, text=True, env=pipeline_env, timeout=60)
    assert done.returncode == 3 and "stopped before its summary" in done.stderr
    child = aggregate.start_report(out)
    aggregate.stop_report(child)
    assert child is not None and child.returncode is not None and not (out / "report.html").exists()

"""A video's outcome written as it finishes: its line in the run's outcomes files, its part of the summary in the
run's counters, each video counted once whatever the deliveries, and a run's end that writes the same summary
from them (real Redis, real files, the real statistics callback)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import redis

from tests.test_completion import configure_for, waiting


def _span(start: float, took: float) -> dict:
    from tasks.job import StageTiming

    return {"h5": StageTiming(start=start, end=start + took, worker="cpu@test", skipped=False)}


def _run(redis_url: str, monkeypatch, tmp_path, count: int, run_id: str):
    configure_for(monkeypatch, redis_url)
    from tasks.run import runs
    from tasks.run.dataset import build_jobs

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    entries = [{"video_id": f"v{i}", "path": f"v{i}.mp4"} for i in range(count)]
    jobs, run = build_jobs(entries, tmp_path, tmp_path / "out", run_id)
    record = {**run, "callback_id": f"callback-{run_id}"}
    runs.publish(r, record, 3600)
    return r, jobs, record


def test_each_video_counts_once_whatever_its_deliveries_and_the_end_writes_the_summary_from_the_counters(
    redis_url, monkeypatch, tmp_path
):
    r, jobs, record = _run(redis_url, monkeypatch, tmp_path, 5, "once")
    from tasks.job import Failure
    from tasks.records import manifest, outcome_files
    from tasks.run import aggregate, completion, tally

    made = {"quality": {"q": 1}, "provenance": {"backends": {"depth": "synthetic"}, "run_id": "once"}}
    done = [replace(job, timings=_span(10.0 * i, 1.0 + i), report=made) for i, job in enumerate(jobs)]
    broke = Failure("h5", "Boom", "disk", 3, "cpu@test", 5.0)
    low = Failure("h5", "low_quality", "gate", 1, "cpu@test", 6.0, detail={"shortfalls": ["hands"]})

    completion.video_ended(r, done[0], 3600)
    # v1: its worker killed between the line and the count, then the task delivered again.
    outcome = {k: v for k, v in done[1].to_dict().items() if k in completion.OUTCOME_KEYS}
    outcome_files.append(tmp_path / "out", "once", *tally.classify("once", outcome))
    completion.video_ended(r, done[1], 3600)
    # v2: its chain failed, then a second chain (the sweep's) made it.
    completion.video_ended(r, replace(jobs[2], failed=broke), 3600)
    completion.video_ended(r, done[2], 3600)
    # v3: done, its end delivered twice, then a second chain of it failed: it stays done.
    completion.video_ended(r, done[3], 3600)
    completion.video_ended(r, done[3], 3600)
    completion.video_ended(r, replace(jobs[3], failed=broke), 3600)
    # v4: failed, then failed again at the quality gate: the newer failure stands.
    completion.video_ended(r, replace(jobs[4], failed=broke), 3600)
    assert waiting(r)[-1] == ("framefleet.aggregate", "callback-once")  # five videos counted: the end is sent
    completion.video_ended(r, replace(jobs[4], failed=low), 3600)

    fields, failures = completion.counted(r, "once")
    assert fields["videos"] == 5 and fields["done"] == 4 and fields["s:h5:tasks"] == 4
    assert fields["s:h5:us"] == 1_000_000 * (1 + 2 + 3 + 4) and fields["s:h5:max_us"] == 4_000_000
    assert [f["video_id"] for f in failures] == ["v4"] and failures[0]["error_class"] == "low_quality"

    summary = aggregate.aggregate.run(completion.callback_run(record))
    assert (summary["videos"], summary["done"]) == (5, 4)
    written = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert written["done_videos"] == ["v0", "v1", "v2", "v3"] and "outcomes_unmatched" not in written
    assert [f["video_id"] for f in written["failed"]] == ["v4"] and written["low_quality"] == {"v4": ["hands"]}
    h5 = written["stages"]["h5"]
    assert (h5["tasks"], h5["workers"], h5["mean_s"], h5["max_s"], h5["total_s"]) == (
        4,
        {"cpu@test": 4},
        2.5,
        4.0,
        10.0,
    )
    assert written["backends"] == {"depth": "synthetic"}

    # The run's files say what the summary says, each video once, read by the manifest's readers.
    assert not outcome_files.live_dir(tmp_path / "out", "once").exists()
    recorded = manifest.outcomes(tmp_path / "out")
    statuses = {vid: json.loads(recorded.get(vid) or "{}").get("status") for vid in (f"v{i}" for i in range(5))}
    assert statuses == {"v0": "done", "v1": "done", "v2": "done", "v3": "done", "v4": "low_quality"}
    assert json.loads(recorded.get("v4") or "{}")["shortfalls"] == ["hands"]


def test_a_counted_video_without_its_line_is_reported_in_the_summary(redis_url, monkeypatch, tmp_path):
    """A line lost after its video was counted (its host lost before the page reached a shared disk): the
    end's counts from Redis and from the files differ, and the summary says so."""
    r, jobs, record = _run(redis_url, monkeypatch, tmp_path, 2, "lost")
    from tasks.records import outcome_files
    from tasks.run import aggregate, completion

    for i, job in enumerate(jobs):
        completion.video_ended(r, replace(job, timings=_span(i, 1.0)), 3600)
    for segment in outcome_files.segments(outcome_files.live_dir(tmp_path / "out", "lost")):
        lines = segment.read_text().splitlines(keepends=True)
        segment.write_text("".join(line for line in lines if json.loads(line)["video_id"] != "v1"))

    aggregate.aggregate.run(completion.callback_run(record))
    written = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert written["videos"] == 2 and written["done_videos"] == ["v0"]
    assert written["outcomes_unmatched"] == {"counted_videos": 2, "counted_done": 2, "file_videos": 1, "file_done": 1}


def test_a_second_end_of_a_run_writes_the_same_summary(redis_url, monkeypatch, tmp_path):
    """The callback delivered again (its worker died after the files): the same summary from the same counters
    and the run's folder already in place."""
    r, jobs, record = _run(redis_url, monkeypatch, tmp_path, 3, "again")
    from tasks.run import aggregate, completion

    for i, job in enumerate(jobs):
        completion.video_ended(r, replace(job, timings=_span(i, 0.5)), 3600)
    aggregate.aggregate.run(completion.callback_run(record))
    first = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    aggregate.aggregate.run(completion.callback_run(record))
    second = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    for summary in (first, second):
        for key in ("finished", "wall_s", "statistics_from"):  # the second reuses the sums the first saved
            summary.pop(key)
    assert first == second and first["done_videos"] == ["v0", "v1", "v2"]


def test_the_summary_text_is_json_dumps_indented_whatever_the_done_ids():
    from tasks.run.aggregate import summary_text

    for done in ([], ["v0"], ["v0", 'odd "id"\n', "é"], [f"v{i}" for i in range(1000)]):
        summary = {"run_id": "r", "done_videos": done, "failed": [{"reason": '\n  "done_videos": []'}], "notes": {}}
        assert summary_text(summary) == json.dumps(summary, indent=2, sort_keys=True)


def test_the_index_gives_what_the_lines_give_whatever_a_stopped_worker_left(tmp_path, monkeypatch):
    """Each segment's index rows read in place of its lines: the same statuses and fields, with a line whose row
    a stopped worker did not write (read from the segment's tail), a torn row, a torn line, and a worker whose
    row could not be written (its next lines go to files of their own)."""
    import os
    import shutil

    from tasks.records import outcome_files

    out = tmp_path / "out"
    statuses = ["done", "low_quality", "failed"]

    def found(status: str, vid: str) -> dict:
        return {"quality": {"q": vid}, "shortfalls": [vid]} if status == "low_quality" else {"quality": {"q": vid}}

    for i in range(12):
        status = statuses[i % 3]
        outcome_files.append(out, "run", f"v{i}", status, found(status, f"v{i}"))
    outcome_files.append(out, "run", "v0", "low_quality", found("low_quality", "again"))  # a video's second line
    live = outcome_files.live_dir(out, "run")
    (segment,) = outcome_files.segments(live)
    index = segment.with_name(segment.name[: -len(outcome_files.SEGMENT)] + outcome_files.INDEX)
    assert index.read_text().count("\n") == 13
    outcome_files._append_line(segment, outcome_files.line_of("v12", "done", {}))  # stopped before its row
    with open(index, "a") as fh:
        fh.write("v12\tdo")  # and in the middle of it
    outcome_files._append_line(segment, 'v13\t{"status": "do')  # a torn line

    real, failing = outcome_files._append_line, ["v14"]

    def no_index(path, line):  # the row of v14 cannot be written once; its retry and v15 go to files of their own
        if path.name.endswith(outcome_files.INDEX) and failing and line.startswith(failing.pop()):
            raise OSError(28, "No space left on device")
        return real(path, line)

    monkeypatch.setattr(outcome_files, "_append_line", no_index)
    monkeypatch.setattr(outcome_files, "_SPLIT", [0])
    with pytest.raises(OSError):
        outcome_files.append(out, "run", "v14", "low_quality", found("low_quality", "v14"))
    outcome_files.append(out, "run", "v14", "low_quality", found("low_quality", "v14"))  # the task's retry
    outcome_files.append(out, "run", "v15", "done", found("done", "v15"))
    assert len(outcome_files.segments(live)) == 2

    wanted = {"v3", "v12", "v15"}
    indexed = outcome_files.read(live, wanted)
    bare = tmp_path / "bare"
    shutil.copytree(live, bare)
    for path in bare.glob("*" + outcome_files.INDEX):
        os.unlink(path)
    assert indexed == outcome_files.read(bare, wanted)
    assert indexed.status["v0"] == "done" and indexed.disagree == {"v0"} and "v13" not in indexed.status
    assert indexed.status["v12"] == "done" and indexed.status["v14"] == "low_quality"
    assert set(indexed.fields) == {"v0", "v1", "v4", "v7", "v10", "v14", "v3", "v12", "v15"}
    assert json.loads(indexed.fields["v0"])["shortfalls"] == ["again"]

    with open(index, "w") as fh:  # an index that does not describe its segment: the segment is read
        fh.write("v0\tdone\t99999999\n")
    assert outcome_files.read(live, wanted) == indexed


def test_a_run_redis_lost_has_its_outcomes_ended_and_a_live_one_is_left_alone(tmp_path):
    from tasks.records import manifest, outcome_files

    out = tmp_path / "out"
    made = {"quality": {"q": 1}, "provenance": {"backends": {"depth": "synthetic"}, "run_id": "lost"}}
    outcome_files.append(out, "lost", "v0", "done", made)
    outcome_files.append(out, "lost", "v1", "failed", {})  # failed, then its second chain made it
    outcome_files.append(out, "lost", "v1", "done", made)
    outcome_files.append(out, "live", "v2", "done", made)
    adopted = outcome_files.adopt_lost(out, lambda run: run == "live")
    assert adopted == [("lost", 2)]
    recorded = manifest.outcomes(out)
    assert {vid: json.loads(recorded.get(vid))["status"] for vid in ("v0", "v1")} == {"v0": "done", "v1": "done"}
    assert recorded.get("v2") is None  # the live run's lines stay its own until its end
    assert outcome_files.live_dir(out, "live").is_dir() and not outcome_files.live_dir(out, "lost").exists()
    assert outcome_files.adopt_lost(out, lambda run: False) == [("live", 1)]


def test_every_video_with_its_status_loads_in_duckdb_from_framefleet_videos(redis_url, monkeypatch, tmp_path):
    """`framefleet videos OUT` streams the manifest merged with the run's outcomes as JSON Lines, which DuckDB
    (and pandas) read as they are: the one line docs/guide.md shows for "which videos failed, and why"."""
    import subprocess
    import sys

    import duckdb

    from tasks.job import Failure
    from tasks.records import manifest
    from tasks.run import aggregate, completion
    from tests.conftest import ROOT

    r, jobs, record = _run(redis_url, monkeypatch, tmp_path, 3, "export")
    out = tmp_path / "out"
    writer = manifest.Writer(out, {"raw_dir": str(tmp_path), "run_id": "export"})
    for i in range(3):
        writer.add({"video_id": f"v{i}", "path": f"v{i}.mp4", "status": "pending"})
    writer.commit()
    completion.video_ended(r, replace(jobs[0], timings=_span(0.0, 1.0)), 3600)
    bad = Failure("tracks", "BadInput", "no texture", 1, "gpu0@t", 1.0)
    completion.video_ended(r, replace(jobs[1], failed=bad), 3600)
    low = Failure("h5", "low_quality", "gate", 1, "cpu@t", 2.0, detail={"shortfalls": ["tracks"]})
    completion.video_ended(r, replace(jobs[2], failed=low), 3600)
    aggregate.aggregate.run(completion.callback_run(record))

    def videos(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "tasks.cli.main", "videos", str(out), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    every = tmp_path / "videos.jsonl"
    every.write_text(videos())
    rows = duckdb.sql(f"SELECT video_id, status FROM read_json_auto('{every}') ORDER BY video_id").fetchall()
    assert rows == [("v0", "done"), ("v1", "failed"), ("v2", "low_quality")]
    failed = [json.loads(line) for line in videos("--status", "failed", "--status", "low_quality").splitlines()]
    assert [(v["video_id"], v["status"]) for v in failed] == [("v1", "failed"), ("v2", "low_quality")]
    assert failed[1]["shortfalls"] == ["tracks"]


def test_an_output_folder_an_earlier_version_wrote_reads_as_before(tmp_path):
    """Lines of the earlier form (the id, a tab, the fields; notes in <...>.notes.jsonl) beside lines of this
    version's (JSON Lines): in an ended run, in a live one its end settles, and merged over the manifest."""
    from tasks.records import manifest, outcome_files, outcome_index

    out = tmp_path / "out"
    writer = manifest.Writer(out, {"raw_dir": str(tmp_path)})
    for i in range(6):
        writer.add({"video_id": f"v{i}", "path": f"v{i}.mp4", "status": "pending"})
    writer.commit()
    earlier = [
        'v0\t{"status": "done", "quality": {"q": 0}}\n',
        'v1\t{"status": "low_quality", "quality": {"q": 1}, "shortfalls": ["hands"]}\n',
        'v2\t{"status": "failed"}\n',
    ]
    ended = manifest.outcomes_path(out, "old")
    ended.mkdir(parents=True)
    (ended / "h-1-a.jsonl").write_text("".join(earlier) + 'v5\t{"status": "do')  # and a torn last line
    (ended / "h-1-a.index").write_text(outcome_index.index_of(earlier))
    (ended / "h-1-a.notes.jsonl").write_text('v2\t{"decoder": "retried"}\n')
    # A run live across the upgrade: a worker of each version, v3 ended by both with other statuses.
    live = outcome_files.live_dir(out, "new")
    live.mkdir(parents=True)
    (live / "h-2-b.jsonl").write_text('v3\t{"status": "failed"}\nv4\t{"status": "done", "quality": {"q": 4}}\n')
    outcome_files.append(out, "new", "v3", "done", {"quality": {"q": 3}}, notes={"gpu": "slow"})

    old = outcome_files.read(ended, {"v0"})
    assert old.status == {"v0": "done", "v1": "low_quality", "v2": "failed"}
    assert old.fields is not None and json.loads(old.fields["v1"])["shortfalls"] == ["hands"]
    assert json.loads(old.fields["v0"])["quality"] == {"q": 0}
    assert outcome_files.notes_of(ended) == {"v2": {"decoder": "retried"}}
    folder, lines = outcome_files.close(out, "new", [], wanted={"v3", "v4"})
    assert lines.status == {"v3": "done", "v4": "done"} and lines.disagree == {"v3"}
    assert lines.fields is not None and json.loads(lines.fields["v4"])["quality"] == {"q": 4}
    assert outcome_files.notes_of(folder) == {"v3": {"gpu": "slow"}}
    merged = {entry["video_id"]: entry for entry in map(json.loads, manifest.lines(out))}
    assert {vid: entry["status"] for vid, entry in merged.items()} == {
        "v0": "done",
        "v1": "low_quality",
        "v2": "failed",
        "v3": "done",
        "v4": "done",
        "v5": "pending",
    }
    assert merged["v3"]["quality"] == {"q": 3} and merged["v1"]["shortfalls"] == ["hands"]


def test_a_line_is_json_with_its_id_and_status_first(tmp_path):
    """What a worker appends loads as JSON Lines and begins with its id and status, which the end's scan of a
    segment without an index finds unparsed."""
    from tasks.records import outcome_files, outcome_index

    line = outcome_files.line_of("v0", "low_quality", {"quality": {"q": 0}, "shortfalls": ["tracks"]})
    assert json.loads(line) == {
        "video_id": "v0",
        "status": "low_quality",
        "quality": {"q": 0},
        "shortfalls": ["tracks"],
    }
    assert line.startswith('{"video_id": "v0", "status": "low_quality", ') and line.endswith("}\n")
    assert outcome_index.pairs(line + line.replace("v0", "v1")[:-9]) == [("v0", "low_quality")]  # and a torn one


def test_the_guides_pandas_and_duckdb_lines_read_a_real_runs_folder(redis_url, monkeypatch, tmp_path):
    """Each line docs/guide.md shows under "Reading a run's records with pandas or DuckDB", run as it is written
    on the folder a real run's end left (its `duckdb -c` lines through DuckDB's Python module, the CLI's engine)."""
    import os
    import re
    import shlex
    import subprocess
    import sys

    import duckdb

    from tasks.job import Failure
    from tasks.records import manifest
    from tasks.run import aggregate, completion
    from tests.conftest import ROOT

    r, jobs, record = _run(redis_url, monkeypatch, tmp_path, 3, "guide")
    out = tmp_path / "out"
    writer = manifest.Writer(out, {"raw_dir": str(tmp_path), "run_id": "guide"})
    for i in range(3):
        writer.add({"video_id": f"v{i}", "path": f"v{i}.mp4", "status": "pending"})
    writer.commit()
    made = {"quality": {"q": 1}, "provenance": {"backends": {"depth": "synthetic"}, "run_id": "guide"}}
    completion.video_ended(r, replace(jobs[0], timings=_span(0.0, 1.0), report=made), 3600)
    completion.video_ended(r, replace(jobs[1], failed=Failure("tracks", "BadInput", "no texture", 1, "g@t", 1.0)), 3600)
    short = {"stage": "tracks", "measure": "visible_fraction", "value": 0.1, "setting": "min_visible", "threshold": 0.3}
    low = Failure("h5", "low_quality", "gate", 1, "cpu@t", 2.0, detail={"shortfalls": [short]})
    completion.video_ended(r, replace(jobs[2], failed=low), 3600)
    aggregate.aggregate.run(completion.callback_run(record))
    here = tmp_path / "here"
    here.mkdir()
    (here / "OUT").symlink_to(out)
    (out / "quarantine.jsonl").touch()  # (its lines: tasks.records.quarantine; none when no video failed for good)

    guide = (ROOT / "docs" / "guide.md").read_text()
    section = guide[guide.index("## Reading a run's records with pandas or DuckDB") :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    commands = [line for block in re.findall(r"```\n(.*?)```", section, re.S) for line in block.splitlines()]
    assert len(commands) == 8
    printed, queried = [], []
    for command in commands:
        words = shlex.split(command)
        if words[0] == "duckdb":
            with duckdb.connect() as con:  # in ``here``: the paths are relative, as the guide writes them
                monkeypatch.chdir(here)
                queried.append(con.execute(words[2]).fetchall())
            continue
        target = None
        if ">" in words:
            words, target = words[: words.index(">")], words[words.index(">") + 1]
        if words[0] == "framefleet":
            words = [sys.executable, "-c", "import sys; from tasks.cli.main import main; sys.exit(main())", *words[1:]]
        elif words[0] == "python":
            words[0] = sys.executable
        done = subprocess.run(
            words,
            cwd=here,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, (command, done.stderr[-2000:])
        if target:
            (here / target).write_text(done.stdout)
        else:
            printed.append(done.stdout)
    every = [json.loads(line) for line in (here / "videos.jsonl").read_text().splitlines()]
    assert [(v["video_id"], v["status"]) for v in every] == [("v0", "done"), ("v1", "failed"), ("v2", "low_quality")]
    assert re.search(r"done\s+1", printed[0]) and re.search(r"low_quality\s+1", printed[0])
    assert queried[0] == [("v2", "tracks", "visible_fraction", 0.1, "min_visible", 0.3)]
    assert queried[2] == [("v0", "v0.mp4", "pending"), ("v1", "v1.mp4", "pending"), ("v2", "v2.mp4", "pending")]
    assert all(f"v{i}" in printed[1] for i in range(3))  # the manifest in pandas
    assert re.search(r"v1\s+failed", printed[2]) and re.search(r"v2\s+low_quality", printed[2])  # outcomes in pandas
    assert sorted(queried[3]) == [("done", 1), ("failed", 1), ("low_quality", 1)]

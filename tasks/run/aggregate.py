"""The statistics callback, a run's end: write the statistics file (tasks.statistics.stats_file), the run summary,
the quarantine and the report, and retire the run's keys in Redis.

tasks.run.completion sends it once every video of the run has finished; it reads the videos'
outcomes from Redis (an earlier version's chord passed them as its first argument).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from tasks.backends.defaults import describe
from tasks.celery_app import TASK_PREFIX, app, settings
from tasks.delivery import requeues
from tasks.errors import BadJobMessage, PathOutsideRoot
from tasks.job_check import check_id, check_root
from tasks.observe import progress
from tasks.observe.flower_view import VideoTask
from tasks.outputs import remote
from tasks.outputs.storage import write_text_atomic
from tasks.pipeline import admission, quality
from tasks.records import manifest, outcome_files, outcomes, quarantine
from tasks.redis_client import get_redis
from tasks.report import quality_table
from tasks.run import completion, runs, sweep
from tasks.run.tally import Tally
from tasks.stages import STAGE_NAMES, dataset_stage, model_backends
from tasks.statistics import partials, sums
from tasks.statistics.stats_file import Ended, write_statistics_from
from tasks.workers import confinement

log = logging.getLogger("framefleet.aggregate")
REPORT_TIMEOUT_S = 120


def _requeued(r: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's requeues after a lost worker (tasks/delivery/requeues.py); [] when Redis does not answer."""
    try:
        return requeues.read(r, run_id) if r is not None else []
    except Exception:  # the summary matters more than this part of it
        return []


def _resent(r: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's videos sent again by the sweep (tasks/sweep.py); [] when Redis does not answer."""
    try:
        return sweep.resent(r, run_id) if r is not None else []
    except Exception:  # the summary matters more than this part of it
        return []


def start_report(out_root: Path) -> subprocess.Popen[str] | None:
    """Start the report's process (``python -m tasks.report.report OUT --table -``) while the run's end does its
    work: its start-up (Python, matplotlib: about a second) overlaps the end's; it waits on its standard input
    for ``write_report``, and exits without writing when that closes first. None when it cannot start."""
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tasks.report.report", str(out_root), "--table", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        log.warning("report not written: %s; run python -m tasks.report.report %s", exc, out_root)
        return None


def write_report(
    out_root: Path, table: tuple[list[dict[str, Any]], int] | None = None, child: subprocess.Popen[str] | None = None
) -> None:
    """Build OUT/report.html while Redis still holds the run's stage log, and wait for it; never raises.
    ``table``: its quality table's videos and count as the run's end found them (``quality_table.chosen``;
    None: the report reads them itself); ``child``: the report's process (``start_report``; None: started now).

    It runs in a child process: matplotlib stays out of the worker, and a crash or a hang there
    (bounded by REPORT_TIMEOUT_S) cannot take this callback with it.
    """
    started = time.monotonic()
    child = child or start_report(out_root)
    if child is None:
        return
    given = json.dumps({"videos": table[0], "count": table[1]} if table is not None else None)
    try:
        _out, err = child.communicate(given, timeout=REPORT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        stop_report(child)
        log.warning("report not written: %s; run python -m tasks.report.report %s", exc, out_root)
        return
    if child.returncode:
        log.warning("report not written (exit status %d): %s", child.returncode, err.strip()[-2000:])
    else:
        log.info("report written in %.1f s: %s", time.monotonic() - started, out_root / "report.html")


def stop_report(child: subprocess.Popen[str] | None) -> None:
    """Stop the report's process if it still runs (the end stopped before its summary was written)."""
    if child is not None and child.poll() is None:
        child.kill()
        child.communicate()


def _run_backends(found: dict[str, Any] | None) -> dict[str, str]:
    """The backends this run's files record (``Tally.backends``), or, with none, this worker's settings."""
    if found:
        return {k: found[k] for k in STAGE_NAMES if found.get(k, "builtin") != "builtin"}  # in chain order
    return model_backends(settings())


@app.task(name=TASK_PREFIX + "aggregate", acks_late=True, base=VideoTask, throws=(BadJobMessage, PathOutsideRoot))
def aggregate(first: Any, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Statistics callback of a run: write normalization_stats.yaml and run_summary.json; return the summary.

    Called as ``aggregate(run)`` by tasks.run.completion (the summary's per-video parts come from the run's
    counters in Redis, the done videos from its outcomes files: no video's outcome is read), or as
    ``aggregate(results, run)`` by the chord of an earlier version.
    """
    try:
        r = get_redis(settings().redis_url)
        r.ping()
    except Exception:
        r = None
    if run is None:
        run = first
        # An earlier version's outcomes of this run (workers of two versions): read from Redis as it kept them.
        results: Iterable[dict[str, Any]] = (
            (outcome for _vid, outcome in outcomes.read(r, run["run_id"])) if r is not None else ()
        )
    else:
        results = first
    # The callback's own gate (tasks.pipeline.gate for stage tasks): its run id names files in OUT/runs/.
    run_id = check_id("run_id", run.get("run_id"))
    out_root = Path(check_root("output_root", run.get("output_root")))
    confinement.check_roots({"output_root": str(out_root)}, settings())
    if not admission.callback(run, settings()):  # raises NotTheRunsJob for a folder or a seal not the run's
        log.warning(
            "run %s has ended (its record in %s says so): its files stand, nothing is written", run_id, out_root
        )
        return _short(_summary(out_root, run_id) or {"run_id": run_id})
    remote.pull(out_root)  # an object-store OUT: what other hosts published (tasks.outputs.remote)
    track_type = settings().stages[dataset_stage().name].params.get("track_type", "3d")
    tally = Tally(run_id, settings().enabled_stages())
    extra = []
    for outcome in results:
        extra.append(outcome_files.line_of(*tally.add(outcome)))
    fields, failures = completion.counted(r, run_id) if r is not None else ({}, [])
    if not tally.videos and not fields and run.get("videos") and (earlier := _summary(out_root, run_id)) is not None:
        # Delivered again after the run was retired (its counters gone): the summary written then stands.
        log.warning("run %s: its summary was written already and its counters are gone; keeping it", run_id)
        if (runs.read(out_root, run_id) or {}).get("status") != "finished":  # its worker died before the record
            runs.finished(out_root, run_id, earlier)
        return _short(earlier)
    report = start_report(out_root)  # its start-up beside the end's work
    try:
        wanted = quality_table.wanted(out_root)  # the report's quality table, from the same read of the lines
        folder, lines = outcome_files.close(out_root, run_id, failures, extra, wanted)  # before the statistics' header
        tally.add_counts(fields, failures, outcome_files.notes_of(folder))
        done = sorted(vid for vid, status in lines.status.items() if status == "done")
        failed, low = tally.failed, tally.low
        unmatched = _unmatched(run_id, tally, lines, len(done))
        current: dict[str, bytes] = {}
        folded = partials.segments(out_root)  # before the read: a segment begun later stays
        not_done = [vid for vid, status in lines.status.items() if status != "done"]
        digest = None
        if tally.done_digest is not None:  # and an earlier version's outcomes (few), by their ids
            digest = tuple(map(sum, zip(tally.done_digest, sums.digest_of(tally.done), strict=True)))
        count = len(tally.done) + tally.counted_done
        ended = Ended(run_id, dict(tally.provenance_sets), count, digest, not_done, unmatched is None)
        merged, source = write_statistics_from(out_root, track_type, r, current, run_id, ended)
        try:
            if current:  # the full pass ran: its entries in one file, the segments it read folded in
                partials.save(out_root, current, folded)
        except OSError as exc:
            log.warning("%s not written (%s): the next statistics read the markers", partials.file_path(out_root), exc)
        quarantined = quarantine.update(out_root, failed, done, r)
        backends = _run_backends(tally.backends())
        summary = {
            "run_id": run["run_id"],
            "videos": tally.videos,
            "done": len(done),
            "already_complete": run.get("already_complete", 0),
            "failed": failed,
            "quarantined": [q["video_id"] for q in quarantined],
            "done_videos": done,
            "statistics_videos": merged,
            "statistics_from": source,
            "started": run.get("started"),
            "finished": time.time(),
            "wall_s": time.time() - run["started"] if run.get("started") else None,
            "stages": tally.stage_timings(),
            "notes": tally.notes,
            "backends": backends,
            "backend_lines": describe(backends),
            "low_quality": {vid: detail.get("shortfalls", []) for vid, detail in low.items()},
            "gates_caught": quality.caught({vid: d.get("shortfalls", []) for vid, d in low.items()}, failed),
            "requeued": _requeued(r, run["run_id"]),
            "resent": _resent(r, run["run_id"]),
            "outputs": {
                "statistics": "normalization_stats.yaml",
                "hdf5": "{video_id}.hdf5",
                "quarantine": quarantine.FILE,
                "report": "report.html",
                "outcomes": str(manifest.outcomes_path(Path(), run["run_id"])),
            },
        }
        if unmatched:
            summary["outcomes_unmatched"] = unmatched
        if r is not None:
            _adopt_lost(r, out_root)
        write_text_atomic(out_root / "run_summary.json", summary_text(summary))
        log.info("run %s: %d done, %d failed; statistics over %d videos", run["run_id"], len(done), len(failed), merged)
        if r is not None:
            _retire(r, out_root, run["run_id"])
        write_report(out_root, _quality_table(out_root, run_id, lines), report)
        remote.push(out_root)  # an object-store OUT: what the end wrote without atomic_write, before the record
        runs.finished(out_root, run_id, summary)  # last: the record's "finished" says every file of the end is whole
        return _short(summary)
    finally:
        stop_report(report)


def _adopt_lost(r: Any, out_root: Path) -> None:
    """The outcomes of a run Redis lost whose tasks were still ending when the enqueue that replaced it took
    them (tasks.records.outcome_files.adopt_lost): by this run's end those tasks have long ended."""
    try:
        for lost, videos in outcome_files.adopt_lost(out_root, lambda run: runs.lookup(r, run) is not None):
            log.warning("run %s, lost by Redis: the outcomes of %d more video(s) put into %s", lost, videos, out_root)
    except (OSError, RedisError) as exc:
        log.warning("the outcomes of runs Redis lost not ended (%s): the next enqueue ends them", exc)


def _quality_table(out_root: Path, run_id: str, lines: outcome_files.Lines) -> tuple[list[dict[str, Any]], int] | None:
    """The report's quality table from the run's outcomes lines as the end read them; None (the report's own
    pass) when they do not give it, or on an error (the report matters less than the run's files)."""
    try:
        return quality_table.chosen(out_root, run_id, lines)
    except Exception as exc:
        log.warning("run %s: the report's quality table is left to the report (%s)", run_id, exc)
        return None


def summary_text(summary: dict[str, Any]) -> str:
    """``json.dumps(summary, indent=2, sort_keys=True)``, with its list of done videos (a million ids) written
    by the C encoder: the same text, without the pure-Python encoder that ``indent`` takes for every item."""
    done = summary.get("done_videos")
    if not done:
        return json.dumps(summary, indent=2, sort_keys=True)
    text = json.dumps({**summary, "done_videos": []}, indent=2, sort_keys=True)
    listed = json.dumps(done, separators=(",\n    ", ": "))  # as indent=2 writes a list at the top level's depth
    # Outside strings only: a newline inside one is written "\n", so this is the top level's key.
    return text.replace('\n  "done_videos": []', '\n  "done_videos": [\n    ' + listed[1:-1] + "\n  ]", 1)


def _unmatched(run_id: str, tally: Tally, lines: outcome_files.Lines, done: int) -> dict[str, int] | None:
    """The counts of videos in Redis and in the outcomes files when they differ (a line lost with its host
    before it reached the disk, or a file removed), else None; logged as an error."""
    counted = {"videos": tally.videos, "done": len(tally.done) + tally.counted_done}
    found = {"videos": len(lines.status), "done": done}
    if counted == found:
        return None
    log.error(
        "run %s: Redis counted %d videos (%d done) but its outcomes files hold %d (%d done); the summary lists "
        "the files' done videos",
        run_id,
        counted["videos"],
        counted["done"],
        found["videos"],
        found["done"],
    )
    return {
        "counted_videos": counted["videos"],
        "counted_done": counted["done"],
        "file_videos": found["videos"],
        "file_done": found["done"],
    }


def _summary(out_root: Path, run_id: str) -> dict[str, Any] | None:
    """OUT/run_summary.json when it is the summary of ``run_id``, else None."""
    try:
        summary = json.loads((out_root / "run_summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if summary.get("run_id") == run_id else None


def _short(summary: dict[str, Any]) -> dict[str, Any]:
    """The callback's result: what `framefleet run` prints."""
    keys = (
        "run_id",
        "videos",
        "done",
        "failed",
        "quarantined",
        "statistics_videos",
        "wall_s",
        "backend_lines",
        "gates_caught",
    )
    return {k: summary.get(k) for k in keys}


def _retire(r: Any, out_root: Path, run_id: str) -> None:
    """Count the callback, write the run's stage log to OUT/runs/, and let the run's per-video keys go
    (docs/redis-keys.md); never raises."""
    conf = settings()
    try:  # how often the callback ran (once per run: tasks.run.completion)
        progress.record(r, run_id, "aggregate", True, conf.result_expires_s)
        runs.save_stage_log(r, out_root, run_id)
        completion.retire(r, run_id, conf.finished_run_keep_s)
        outcomes.drop(r, run_id)  # an earlier version's outcomes, in OUT/runs/<run>.outcomes/ now
        partials.retire(r, out_root.resolve(), conf.finished_run_keep_s)
    except Exception as exc:  # they expire with their TTLs anyway
        log.warning("run %s: its Redis keys not retired (%s); they expire with their TTLs", run_id, exc)

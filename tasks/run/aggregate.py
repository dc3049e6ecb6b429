"""The statistics callback: merge every completed video's partial statistics and write the run summary.

tasks.run.completion sends it once every video of the run has finished; it reads the videos'
outcomes from Redis (an earlier version's chord passed them as its first argument).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from redis.exceptions import RedisError

from tasks.backends.defaults import describe
from tasks.celery_app import TASK_PREFIX, app, settings
from tasks.delivery import requeues
from tasks.observe import progress
from tasks.observe.flower_view import VideoTask
from tasks.outputs.stage_io import marked_videos, read_done
from tasks.outputs.storage import write_text_atomic
from tasks.redis_client import get_redis
from tasks.run import (
    completion,
    lineage,
    manifest,
    outcome_files,
    outcomes,
    partials,
    quality_table,
    quarantine,
    runs,
    sums,
    sweep,
)
from tasks.run.tally import Tally
from tasks.stages import STAGE_NAMES, dataset_stage, model_backends

log = logging.getLogger("framefleet.aggregate")
REPORT_TIMEOUT_S = 120


def _candidates(root: Path) -> tuple[set[str], set[str]]:
    """(video ids with a marker under OUT/markers/, video ids with a work folder: markers of earlier versions)."""
    try:
        folders = {e.name for e in os.scandir(root / "work") if e.is_dir(follow_symlinks=False)}
    except FileNotFoundError:
        folders = set()
    return marked_videos(root), folders


def completed_videos(out_root: Path) -> dict[str, dict[str, Any]]:
    """Return the h5 marker of every video of ``out_root`` whose HDF5 file is complete, any run.

    The markers live under OUT/markers/ (they outlive OUT/work/ under ``--intermediates drop``);
    those of earlier versions in OUT/work/<video>/. A work folder that is a link is not followed.
    """
    root = out_root.resolve()
    marked, folders = _candidates(root)
    found = {}
    final = dataset_stage().name
    for vid in sorted(marked | folders):
        record = read_done(root, vid, final, check_hash=False)
        if record is not None and "stats" in record.get("report", {}):
            found[vid] = record
    return found


def completed_partials(
    out_root: Path,
    track_type: str,
    r: Any = None,
    current: dict[str, bytes] | None = None,
    ids: list[str] | None = None,
) -> np.ndarray:
    """Return the partial statistics of every video of ``out_root`` whose HDF5 file is complete, any
    run, as rows (tasks.run.stats.to_row) in video id order.

    The same videos and partials as ``completed_videos``, read from tasks.run.partials (OUT's file and
    the Redis hash of a live run: one read each and a stat per file) where an entry matches the file,
    else from the marker. ``current``, if given, receives the entry of every video counted beside a
    marker (for ``partials.save``). Raises ValueError on a partial of another track type.
    """
    root = out_root.resolve()
    marked, folders = _candidates(root)
    kept = partials.known(r, root)
    final = dataset_stage().name
    rows = []
    prefix = str(root) + os.sep  # strings, not Paths: 50,000 of them
    for vid in sorted(marked | folders):
        entry = kept.get(vid) if vid in marked else None  # only beside a marker, as the marker path counts
        row = partials.current(entry, prefix + vid + ".hdf5", track_type) if entry is not None else None
        if row is None:
            record = read_done(root, vid, final, check_hash=False)
            stats = (record or {}).get("report", {}).get("stats")
            if stats is None:
                continue
            row = partials.encode(stats, track_type)
            entry = _entry(prefix + vid + ".hdf5", stats) if current is not None and vid in marked else None
        if current is not None and entry is not None:
            current[vid] = entry
        if ids is not None:
            ids.append(vid)
        rows.append(row)
    return np.frombuffer(b"".join(rows), dtype="<f8").reshape(len(rows), partials.row_width(track_type))


def _entry(output: str, stats: dict[str, Any]) -> bytes | None:
    try:
        return partials.entry_of(output, stats)
    except OSError:
        return None


def write_statistics(
    out_root: Path, track_type: str, r: Any = None, current: dict[str, bytes] | None = None, run_id: str | None = None
) -> int:
    """Write normalization_stats.yaml from every completed video; return how many were merged.

    ``run_id``: the run whose running sums (tasks.run.sums) are used when they cover every complete
    video of ``out_root``, alone or with the sums an earlier run's end saved (a small Redis read, a
    listing of the markers); otherwise, and without it, the full pass: every video's partial, from
    tasks.run.partials' files (``r``: also an earlier version's Redis copy) or its marker. ``current``:
    as for ``completed_partials`` (full pass only). The statistics written are saved with the videos
    they cover (``sums.save``) for the next run.
    """
    return write_statistics_from(out_root, track_type, r, current, run_id)[0]


@dataclass(frozen=True)
class Ended:
    """What the statistics file's header needs of the run that ends: its done videos' backend sets (the
    counters' ``provenance_sets``), how many they are and their digest (``tasks.run.sums.digest_of``; None
    when not known), the ids of its other videos, and whether its outcomes files agree with its counters."""

    run_id: str
    sets: dict[str, int]
    done: int
    digest: tuple[int, ...] | None
    not_done: list[str]
    matched: bool


def write_statistics_from(
    out_root: Path,
    track_type: str,
    r: Any = None,
    current: dict[str, bytes] | None = None,
    run_id: str | None = None,
    ended: Ended | None = None,
) -> tuple[int, str]:
    """``write_statistics``, and where the statistics came from: "running sums", "running sums and
    earlier runs' sums" or "every video". ``ended``: the header's backend sets are the saved ones plus
    the run's when the sums were reused and the run's done videos are the ones it merged (``_header_sets``)."""
    from tasks.run.stats import normalization_stats, pool_rows, write_stats_yaml

    got = sums.covering(r, run_id, out_root, track_type) if run_id else None
    if got is not None:
        covered, source = got
    else:
        ids: list[str] = []
        rows = completed_partials(out_root, track_type, r, current, ids)
        covered = sums.Covered(pool_rows(rows, track_type), len(ids), sums.digest_of(ids))
        source = "every video"
    stats = normalization_stats(covered.total)
    sets, record = _header_sets(out_root.resolve(), covered, source, ended)
    write_stats_yaml(out_root / "normalization_stats.yaml", stats, stats_header(out_root, sets))
    try:
        sums.save(out_root.resolve(), covered, record)
    except OSError as exc:
        log.warning("%s not written (%s): the next run's end takes the full pass", sums.file_path(out_root), exc)
    return covered.videos, source


def _known_runs(root: Path) -> set[str]:
    """The runs whose outcomes the manifest's readers merge: folded into it, or in OUT/runs/."""
    return set(manifest.head(root).get(manifest.FOLDED) or ()) | {rid for rid, _p in manifest.outcome_runs(root)}


def _header_sets(
    root: Path, covered: sums.Covered, source: str, ended: Ended | None
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(the statistics file's backend sets, what ``sums.save`` keeps of them for the next run's end: None
    when they do not count exactly ``covered``'s videos).

    Without the manifest's pass when the sums were reused and the videos are those of the saved sets plus
    this run's, no video in both: the saved sets cover exactly the saved sums' videos, the run's done videos
    are exactly those it merged (count and digest), none of its other videos has a marker (a video of the
    saved sets failed in this run), and no run's outcomes reached the manifest since but this one's. Then
    ``lineage.added_sets``; otherwise (and when that declines) the pass, said in the log."""
    why = None
    if ended is None or source == "every video":
        why = "the statistics took the full pass"
    else:
        found = _added_sets(root, covered, source, ended)
        if isinstance(found, tuple):
            return found
        why = found
    if ended is not None:
        log.info("run %s: the statistics' backend sets from the manifest's pass (%s)", ended.run_id, why)
    keyed, done = lineage.backend_sets_over(root)
    sets = [entry for _key, entry in keyed]
    record = None
    if len(done) == covered.videos and sums.digest_of(done) == covered.digest:
        record = {"sets": [{**entry, "key": key} for key, entry in keyed], "runs": sorted(_known_runs(root))}
    return sets, record


def _added_sets(
    root: Path, covered: sums.Covered, source: str, ended: Ended
) -> tuple[list[dict[str, Any]], dict[str, Any]] | str:
    """``_header_sets`` without the pass, or why not."""
    from tasks.outputs.stage_io import MARKER_SUFFIX, MARKERS_DIR, dataset_file

    saved = sums.load_sets(root)
    mine = covered
    if source == "running sums":
        if saved is not None and saved["videos"]:
            return "the videos of the saved backend sets have no markers now"
        earlier, runs_before = [], set(saved["runs"] if saved is not None else ())
    else:
        before = sums.load(root, covered.total.track_type)
        if saved is None or before is None or saved["videos"] != before.videos:
            return "no backend sets saved with the earlier runs' sums"
        earlier, runs_before = saved["sets"], set(saved["runs"])
        digest = tuple(a - b for a, b in zip(covered.digest, before.digest, strict=True))
        mine = sums.Covered(covered.total, covered.videos - before.videos, digest)
    runs_now = _known_runs(root) - {ended.run_id}
    if not runs_now <= runs_before:
        return f"outcomes of other runs since: {', '.join(sorted(runs_now - runs_before))[:200]}"
    if not ended.matched:
        return "the run's outcomes files and its counters disagree"
    if sum(ended.sets.values()) != ended.done or ended.digest is None:
        return "the run's counters hold the backend sets of some of its done videos only"
    if ended.done != mine.videos or ended.digest != mine.digest:
        return "the run's done videos are not the videos it merged into its sums"
    for vid in ended.not_done:
        if dataset_file(root, vid)[1].exists() or (root / MARKERS_DIR / f"{vid}{MARKER_SUFFIX}").exists():
            return f"{vid} did not end done in this run but has a marker"
    added = lineage.added_sets(earlier, ended.sets)
    if added is None:
        return "two backend sets of as many videos, or one named in two orders"
    record = {
        "sets": [{**entry, "key": key} for key, entry in added],
        "runs": sorted(runs_before | runs_now | {ended.run_id}),
    }
    return [entry for _key, entry in added], record


def stats_header(out_root: Path, sets: list[dict[str, Any]] | None = None) -> list[str]:
    """The statistics file's comment lines: the framefleet that wrote it and the backend sets of its videos
    (``sets``: as ``lineage.backend_sets`` lists them, which is read when not given)."""
    from tasks.outputs.provenance import framefleet_version

    made = framefleet_version()
    lines = [f"framefleet {made['version']}" + (f" (commit {made['commit'][:12]})" if "commit" in made else "")]
    if sets is None:
        sets = lineage.backend_sets(out_root)
    if sets:
        lines.append(f"computed over videos made with {len(sets)} backend set(s) (manifest.json holds their settings):")
    for found in sets:
        backends = found["backends"]
        if isinstance(backends, dict):
            named = " ".join(f"{k}={v}" for k, v in backends.items() if v != "builtin")  # stages without a model
        else:
            named = str(backends)
        lines.append(f"  {found['videos']} videos: {named}; settings sha256 {str(found['settings_sha256'])[:16]}")
    return lines


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
    """Start the report's process (``python -m tasks.run.report OUT --table -``) while the run's end does its
    work: its start-up (Python, matplotlib: about a second) overlaps the end's; it waits on its standard input
    for ``write_report``, and exits without writing when that closes first. None when it cannot start."""
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tasks.run.report", str(out_root), "--table", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        log.warning("report not written: %s; run python -m tasks.run.report %s", exc, out_root)
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
        log.warning("report not written: %s; run python -m tasks.run.report %s", exc, out_root)
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


@app.task(name=TASK_PREFIX + "aggregate", acks_late=True, base=VideoTask)
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
    out_root = Path(run["output_root"])
    run_id = run["run_id"]
    track_type = settings().stages[dataset_stage().name].params.get("track_type", "3d")
    tally = Tally(run_id, settings().enabled_stages())
    extra = []
    for outcome in results:
        extra.append(outcome_files.line_of(*tally.add(outcome)))
    fields, failures = completion.counted(r, run_id) if r is not None else ({}, [])
    if not tally.videos and not fields and run.get("videos") and (earlier := _summary(out_root, run_id)) is not None:
        # Delivered again after the run was retired (its counters gone): the summary written then stands.
        log.warning("run %s: its summary was written already and its counters are gone; keeping it", run_id)
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
        runs.finished(out_root, run["run_id"], summary)
        log.info("run %s: %d done, %d failed; statistics over %d videos", run["run_id"], len(done), len(failed), merged)
        if r is not None:
            _retire(r, out_root, run["run_id"])
        write_report(out_root, _quality_table(out_root, run_id, lines), report)
        return _short(summary)
    finally:
        stop_report(report)


def _adopt_lost(r: Any, out_root: Path) -> None:
    """The outcomes of a run Redis lost whose tasks were still ending when the enqueue that replaced it took
    them (tasks.run.outcome_files.adopt_lost): by this run's end those tasks have long ended."""
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
    keys = ("run_id", "videos", "done", "failed", "quarantined", "statistics_videos", "wall_s", "backend_lines")
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

"""The chord callback: merge every completed video's partial statistics and write the run summary."""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tasks import quarantine, requeues, runs
from tasks.celery_app import TASK_PREFIX, app, settings
from tasks.flower_view import VideoTask
from tasks.job import Job
from tasks.redis_client import get_redis
from tasks.stage_io import MARKERS_DIR, read_done
from tasks.stages import dataset_stage
from tasks.storage import write_text_atomic

log = logging.getLogger("framefleet.aggregate")
REPORT_TIMEOUT_S = 120


def completed_videos(out_root: Path) -> dict[str, dict[str, Any]]:
    """Return the h5 marker of every video of ``out_root`` whose HDF5 file is complete, any run.

    The markers live in OUT/markers/ (they outlive OUT/work/ under ``--intermediates drop``);
    those of earlier versions in OUT/work/<video>/. A work folder that is a link is not followed.
    """
    root = out_root.resolve()
    try:
        folders = [e.name for e in os.scandir(root / "work") if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        folders = []
    found = {}
    final = dataset_stage().name
    candidates = {p.name.removesuffix(".hdf5.done.json") for p in (root / MARKERS_DIR).glob("*.hdf5.done.json")}
    candidates |= set(folders)  # markers of earlier versions
    for vid in sorted(candidates):
        record = read_done(root, vid, final, check_hash=False)
        if record is not None and "stats" in record.get("report", {}):
            found[vid] = record
    return found


def write_statistics(out_root: Path, track_type: str) -> int:
    """Write normalization_stats.yaml from every completed video; return how many were merged."""
    from tasks.stats import VideoStats, normalization_stats, write_stats_yaml

    records = completed_videos(out_root)
    total = VideoStats.pool([r["report"]["stats"] for r in records.values()], track_type)
    write_stats_yaml(out_root / "normalization_stats.yaml", normalization_stats(total))
    return len(records)


def stage_timings(results: list[Job]) -> dict[str, Any]:
    """Per-stage durations and the overhead between one stage's end and the next one's start."""
    out: dict[str, Any] = {}
    order = settings().enabled_stages()
    for i, stage in enumerate(order):
        spans = [r.timings[stage] for r in results if stage in r.timings]
        ran = [s.end - s.start for s in spans if not s.skipped]
        entry: dict[str, Any] = {
            "tasks": len(spans),
            "skipped": len(spans) - len(ran),
            "workers": dict(Counter(s.worker for s in spans)),
        }
        if ran:
            entry.update(mean_s=statistics.fmean(ran), max_s=max(ran), total_s=sum(ran))
        if i:
            prev = order[i - 1]
            gaps = [r.timings[stage].start - r.timings[prev].end for r in results if {stage, prev} <= set(r.timings)]
            if gaps:
                entry["overhead_after_" + prev] = {"mean_s": statistics.fmean(gaps), "max_s": max(gaps)}
        out[stage] = entry
    return out


def _requeued(r: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's requeues after a lost worker (tasks/requeues.py); [] when Redis does not answer."""
    try:
        return requeues.read(r, run_id) if r is not None else []
    except Exception:  # the summary matters more than this part of it
        return []


def write_report(out_root: Path) -> None:
    """Build OUT/report.html while Redis still holds the run's stage log; never raises.

    It runs in a child process: matplotlib stays out of the worker, and a crash or a hang there
    (bounded by REPORT_TIMEOUT_S) cannot take this callback with it.
    """
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tasks.report", str(out_root)],
            capture_output=True,
            text=True,
            timeout=REPORT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("report not written: %s; run python -m tasks.report %s", exc, out_root)
        return
    if done.returncode:
        log.warning("report not written (exit status %d): %s", done.returncode, done.stderr.strip()[-2000:])
    else:
        log.info("report written in %.1f s: %s", time.monotonic() - started, out_root / "report.html")


@app.task(name=TASK_PREFIX + "aggregate", acks_late=True, base=VideoTask)
def aggregate(results: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """Chord callback: write normalization_stats.yaml and run_summary.json; return the summary."""
    out_root = Path(run["output_root"])
    track_type = settings().stages[dataset_stage().name].params.get("track_type", "3d")
    merged = write_statistics(out_root, track_type)
    jobs = [Job.from_dict(r) for r in results]
    done = sorted(j.video_id for j in jobs if not j.failed)
    failed = [{"video_id": j.video_id, "video": j.video, **j.failed.to_dict()} for j in jobs if j.failed]
    try:
        r = get_redis(settings().redis_url)
    except Exception:
        r = None
    quarantined = quarantine.update(out_root, failed, done, r)
    summary = {
        "run_id": run["run_id"],
        "videos": len(results),
        "done": len(done),
        "already_complete": run.get("already_complete", 0),
        "failed": failed,
        "quarantined": [q["video_id"] for q in quarantined],
        "done_videos": done,
        "statistics_videos": merged,
        "started": run.get("started"),
        "finished": time.time(),
        "wall_s": time.time() - run["started"] if run.get("started") else None,
        "stages": stage_timings([j for j in jobs if not j.failed]),
        "notes": {j.video_id: dict(j.notes) for j in jobs if j.notes},
        "requeued": _requeued(r, run["run_id"]),
        "outputs": {
            "statistics": "normalization_stats.yaml",
            "hdf5": "{video_id}.hdf5",
            "quarantine": quarantine.FILE,
            "report": "report.html",
        },
    }
    write_text_atomic(out_root / "run_summary.json", json.dumps(summary, indent=2, sort_keys=True))
    runs.finished(out_root, run["run_id"], summary)
    log.info("run %s: %d done, %d failed; statistics over %d videos", run["run_id"], len(done), len(failed), merged)
    write_report(out_root)
    keys = ("run_id", "videos", "done", "failed", "quarantined", "statistics_videos", "wall_s")
    return {k: summary[k] for k in keys}

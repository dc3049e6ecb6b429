"""The dataset's statistics file, OUT/normalization_stats.yaml: which videos are complete, their partial
statistics merged (from the run's running sums, or every video's partial) and the file's header, the
framefleet that wrote it and the backend sets of its videos.

tasks.run.aggregate writes it at a run's end (``write_statistics_from`` with the run's ``Ended``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.outputs.stage_io import marked_videos, read_done
from tasks.records import lineage, manifest
from tasks.stages import dataset_stage
from tasks.statistics import partials, sums

log = logging.getLogger("framefleet.aggregate")  # the run's end's log, as before this module was split from it


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
    run, as rows (tasks.statistics.stats.to_row) in video id order.

    The same videos and partials as ``completed_videos``, read from tasks.statistics.partials (OUT's file and
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

    ``run_id``: the run whose running sums (tasks.statistics.sums) are used when they cover every complete
    video of ``out_root``, alone or with the sums an earlier run's end saved (a small Redis read, a
    listing of the markers); otherwise, and without it, the full pass: every video's partial, from
    tasks.statistics.partials' files (``r``: also an earlier version's Redis copy) or its marker. ``current``:
    as for ``completed_partials`` (full pass only). The statistics written are saved with the videos
    they cover (``sums.save``) for the next run.
    """
    return write_statistics_from(out_root, track_type, r, current, run_id)[0]


@dataclass(frozen=True)
class Ended:
    """What the statistics file's header needs of the run that ends: its done videos' backend sets (the
    counters' ``provenance_sets``), how many they are and their digest (``tasks.statistics.sums.digest_of``; None
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
    from tasks.statistics.stats import normalization_stats, pool_rows, write_stats_yaml

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
    from tasks.outputs.provenance import framefleet_version, with_changes

    made = framefleet_version()
    commit = f" (commit {with_changes(made['commit'], made.get('modified_files', 0))})" if "commit" in made else ""
    lines = [f"framefleet {made['version']}{commit}"]
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

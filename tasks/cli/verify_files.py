"""`framefleet verify`'s file part: every dataset file against the sha256 its completion marker recorded, and
the manifest's done videos against the files, both ways.

A file edited after its stage wrote it (its pixels overwritten, its size kept), cut short, or missing,
and a file no run recorded, are each a problem line: the contract checks read what the file holds,
this says whether it is still what framefleet wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.errors import PathOutsideRoot
from tasks.outputs.stage_io import MARKER_SUFFIX, MARKERS_DIR, marker_of, work_dir
from tasks.outputs.storage import sha256_file
from tasks.records import manifest
from tasks.stages import dataset_stage


def _marker(out_dir: Path, video_id: str) -> dict[str, Any] | None:
    """The dataset file's completion marker, where this version writes it or where earlier ones did."""
    final = dataset_stage().name
    try:
        places = [
            marker_of(out_dir, video_id, final),
            out_dir / MARKERS_DIR / f"{video_id}{MARKER_SUFFIX}",
            work_dir(out_dir, video_id) / f"{final}.done.json",
        ]
    except PathOutsideRoot:  # a file name that is no video's id
        return None
    for place in places:
        try:
            return dict(json.loads(place.read_text()))
        except (OSError, ValueError, TypeError):
            continue
    return None


def check(out_dir: Path, files: list[Path]) -> tuple[list[str], list[str]]:
    """Return (lines to print, problems) of ``files`` (OUT/*.hdf5) against their markers and the manifest."""
    whole = manifest.read(out_dir)
    if not whole:
        return [f"{out_dir}: no {manifest.MANIFEST}: files not checked against their markers and the manifest"], []
    entries = whole.get("videos", [])
    done = {e["video_id"]: e for e in entries if e.get("status") == "done" and e.get("video_id")}
    known = {e.get("video_id") for e in entries}
    problems = []
    present = {path.stem: path for path in files}
    for vid in sorted(set(done) - set(present)):
        problems.append(
            f"{vid}.hdf5: missing, but the manifest records {done[vid].get('path', vid)!r} as done; "
            "`framefleet enqueue RAW --out OUT --continue` makes it again"
        )
    for vid, path in sorted(present.items()):
        if vid not in known:
            problems.append(f"{path.name}: no video of the manifest has this file: not written by a run of this folder")
            continue
        problems += _against_marker(out_dir, vid, path)
    checked = len(present) - sum(1 for vid in present if vid not in known)
    return [f"files: {checked} of {len(present)} checked against their markers' sha256; {len(done)} done"], problems


def _against_marker(out_dir: Path, vid: str, path: Path) -> list[str]:
    record = _marker(out_dir, vid)
    if record is None:
        return [f"{path.name}: no completion marker: its stage never finished it; --continue makes it again"]
    try:
        size = path.stat().st_size
        if size != record.get("bytes"):
            return [f"{path.name}: {size} bytes, its marker says {record.get('bytes')}: truncated or replaced"]
        digest = sha256_file(path)
    except OSError as exc:
        return [f"{path.name}: unreadable ({exc.strerror or exc})"]
    if digest != record.get("sha256"):
        return [
            f"{path.name}: sha256 {digest[:16]}…, its marker says {str(record.get('sha256'))[:16]}…: edited since "
            "it was written; `framefleet enqueue RAW --out OUT --continue` makes it again"
        ]
    return []

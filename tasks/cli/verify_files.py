"""`framefleet verify`'s file part: every dataset file against the sha256 its completion marker recorded, its
source against the manifest's entry, and the manifest's done videos against the files, both ways.

A file edited after its stage wrote it (its pixels overwritten, its size kept), cut short, or missing,
and a file no run recorded, are each a problem line: the contract checks read what the file holds,
this says whether it is still what framefleet wrote. A file made from another video than its manifest
entry names (a forced rewrite from another source, or two files swapped together with their markers) is
one too: the source path and sha256 the file records must be its entry's, and its id the one its path gives.
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
    by_id = {e.get("video_id"): e for e in entries}
    known = set(by_id)
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
        problems += _against_marker(out_dir, vid, path) or _against_source(vid, path, by_id[vid])
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


def _against_source(vid: str, path: Path, entry: dict[str, Any]) -> list[str]:
    """The problem of a file whose recorded source is not its manifest entry's (path, sha256, or the id its
    path gives); none for a file that records no source (an earlier version's)."""
    from tasks.outputs import provenance_file
    from tasks.run.dataset import video_id_of

    try:
        source = (provenance_file.read_attrs(path) or {}).get("source")
    except Exception as exc:  # not HDF5 at all: the contract checks name it
        return [f"{path.name}: unreadable ({exc})"]
    if not isinstance(source, dict) or "path" not in source:
        return []
    made_from, recorded = str(source["path"]), (entry.get("provenance") or {}).get("source_sha256")
    fix = "made again from its own video by `framefleet enqueue RAW --out OUT --force`"
    if made_from != entry.get("path") or video_id_of(made_from) != vid:
        return [
            f"{path.name}: made from {made_from!r}, but its manifest entry is {entry.get('path')!r}: rewritten from "
            f"another video or swapped with another file; {fix}"
        ]
    if recorded and source.get("sha256") != recorded:
        return [
            f"{path.name}: made from a {made_from!r} of sha256 {str(source.get('sha256'))[:16]}…, the manifest "
            f"records {str(recorded)[:16]}…: rewritten from another source; {fix}"
        ]
    return []

"""OUT/manifest.json read and written as a stream: its head on the first line, then one video a line.

A manifest this version writes says ``"order": "parts"``: its videos are sorted by (root, path parts),
the order in which tasks.run.listing walks a folder, so a run merges the earlier entries with the
videos it lists in one pass over each, holding neither in memory. The new file is written beside the
old one (in OUT/runs/) and replaces it at the end (an enqueuer that dies mid-way leaves the earlier
manifest, and its part, which the next run removes). A
manifest of an earlier version (another order, or indented JSON) is read whole once and sorted.

What a run records of its videos (status, quality, provenance) goes to files of its own,
OUT/runs/<run>.outcomes/*.jsonl (JSON Lines, a line per video: its id, its status, the fields to set;
an earlier version's lines were the id, a tab, the fields; tasks.records.outcome_files: each video's line
appended as it finishes, the folder in place at the run's end; an earlier version wrote one file,
OUT/runs/<run>.outcomes.jsonl), not into the manifest: rewriting a million videos'
manifest at each run's end took longer than the run's statistics. Readers here merge those files over
the manifest's entries (the newer run's last); the next enqueue writes them into the manifest as it
rewrites it anyway, and names them in its head (``folded``), so a file left behind is not merged twice.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
ORDER = "parts"
TAIL = ', "videos": ['  # what ends the head's line (tasks.records.lineage.write writes the same)
PARTS = "runs"  # the folder the new manifest is written in before it replaces the old (tasks.run.runs.FOLDER)
OUTCOMES = ".outcomes"  # OUT/runs/<run>.outcomes/: what a run recorded of its videos (tasks.records.outcome_files)
SEGMENT = ".jsonl"  # a segment of a run's outcomes folder: a line per video
NOTES = ".notes"  # a segment's notes: a line of JSON per video with notes, {"video_id": …, "notes": …}
# An earlier version's notes (video id, a tab, the notes): ".jsonl" kept them among the segments' names.
LEGACY_NOTES = ".notes.jsonl"
LEGACY_OUTCOMES = ".outcomes.jsonl"  # OUT/runs/<run>.outcomes.jsonl: an earlier version's one file per run
FOLDED = "folded"  # the head's list of the runs whose outcomes files the manifest holds
_ID = '"video_id": "'  # how json.dumps writes an entry's id: found without parsing the line
_LINE_HEAD = b'{"video_id": "'  # how an outcomes line begins (tasks.records.outcome_files.line_of)


def sort_key(entry: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """Where an entry sits in the manifest: its root ("" for the first run's), then its path's parts."""
    return entry.get("root", ""), tuple(entry["path"].split("/"))


def read(out_dir: Path) -> dict[str, Any]:
    """The whole manifest of ``out_dir`` (every video's entry in memory, with what the runs' ends
    recorded), or {} when there is none."""
    whole = _whole(out_dir)
    recorded = outcomes(out_dir, whole)
    if recorded:
        for entry in whole.get("videos", []):
            fields = recorded.get(entry.get("video_id"))
            if fields is not None:
                entry.update(json.loads(fields))
    return whole


def _whole(out_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((out_dir / MANIFEST).read_text()))
    except (OSError, ValueError):
        return {}


def outcomes_path(out_dir: Path, run_id: str) -> Path:
    """The folder of the run's outcomes files once the run has ended."""
    return out_dir / PARTS / f"{run_id}{OUTCOMES}"


def outcome_runs(out_dir: Path, top: dict[str, Any] | None = None) -> list[tuple[str, Path]]:
    """(run id, its ended outcomes folder or an earlier version's file) of the runs whose outcomes the
    manifest (whose head is ``top``) does not hold yet, oldest run first (run ids begin with their start time)."""
    folded = set((head(out_dir) if top is None else top).get(FOLDED) or ())
    try:
        names = sorted(n for n in os.listdir(out_dir / PARTS) if not n.startswith("."))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        for suffix in (OUTCOMES, LEGACY_OUTCOMES):
            if name.endswith(suffix) and name[: -len(suffix)] not in folded:
                found.append((name[: -len(suffix)], out_dir / PARTS / name))
    return found


def _outcomes_left(out_dir: Path, run_id: str) -> bool:
    """Whether the run's outcomes (folder or an earlier version's file) are still in OUT/runs/."""
    return outcomes_path(out_dir, run_id).exists() or (out_dir / PARTS / f"{run_id}{LEGACY_OUTCOMES}").exists()


def segments(folder: Path) -> list[Path]:
    """The outcome segments of a run's folder (tasks.records.outcome_files writes them), in reading order (the end's
    own last); [] without it."""
    try:
        names = [n for n in os.listdir(folder) if n.endswith(SEGMENT) and not n.endswith(LEGACY_NOTES) and n[:1] != "."]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [folder / n for n in sorted(names)]


def outcome_files(out_dir: Path, top: dict[str, Any] | None = None) -> list[Path]:
    """The runs' outcomes files the manifest does not hold yet, in reading order (``outcome_runs``)."""
    found: list[Path] = []
    for _run, path in outcome_runs(out_dir, top):
        found += segments(path) if path.name.endswith(OUTCOMES) else [path]
    return found


class Recorded:
    """Video id -> the fields (JSON text) the runs' ends recorded and the manifest does not hold yet, the
    newer run's over the older's, read from the files when asked for (``get``): in memory, a number per
    video (a million videos' fields are about 780 MB). A line cut short (a writer killed mid-way) is skipped."""

    def __init__(self, paths: list[Path]) -> None:
        self._maps: list[mmap.mmap] = []
        self._at: dict[int, int] = {}  # hash of the id -> (file index << 40) | offset of its line
        self._clashes: dict[str, int] = {}  # ids whose hash another id has
        for path in paths:
            try:
                with open(path, "rb") as fh:
                    found = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # an empty file cannot be mapped: it holds nothing
                continue
            index, data, at = len(self._maps), found, 0
            self._maps.append(found)
            while (end := data.find(b"\n", at)) >= 0:
                if data[end - 1 : end] == b"}":
                    if data[at : at + len(_LINE_HEAD)] == _LINE_HEAD:  # {"video_id": "<id>", "status": …}
                        if (vid := _line_id(data, at + len(_LINE_HEAD), end)) is not None:
                            self._put(vid, (index << 40) | at)
                    elif (tab := data.find(b"\t", at, end)) > at:  # an earlier version's: id, tab, fields
                        self._put(data[at:tab].decode(), (index << 40) | at)
                at = end + 1

    def _put(self, vid: str, where: int) -> None:
        key = hash(vid)
        held = self._at.get(key)
        if held is None or self._id_at(held) == vid:
            self._at[key] = where
        else:
            self._clashes[vid] = where

    def _id_at(self, where: int) -> str:
        data, at = self._maps[where >> 40], where & ((1 << 40) - 1)
        if data[at : at + len(_LINE_HEAD)] == _LINE_HEAD:
            return _line_id(data, at + len(_LINE_HEAD), data.find(b"\n", at)) or ""
        return data[at : data.find(b"\t", at)].decode()

    def get(self, vid: str | None) -> str | None:
        """The fields recorded of ``vid`` (JSON text), or None."""
        if vid is None:
            return None
        where = self._clashes.get(vid) if self._clashes else None
        if where is None:
            where = self._at.get(hash(vid))
            if where is None or self._id_at(where) != vid:
                return None
        data, at = self._maps[where >> 40], where & ((1 << 40) - 1)
        if data[at : at + len(_LINE_HEAD)] == _LINE_HEAD:  # the line is the fields (its id among them, the same)
            return data[at : data.find(b"\n", at)].decode()
        return data[data.find(b"\t", at) + 1 : data.find(b"\n", at)].decode()

    def __len__(self) -> int:
        return len(self._at) + len(self._clashes)


def outcomes(out_dir: Path, top: dict[str, Any] | None = None) -> Recorded:
    """What the runs' ends recorded that the manifest does not hold yet (``Recorded``)."""
    return Recorded(outcome_files(out_dir, top))


def _line_id(data: mmap.mmap, start: int, end: int) -> str | None:
    """The id of an outcomes line whose id's text begins at ``start`` (json.dumps escapes a quote or a backslash
    in it: the id ends at the first quote after an even number of backslashes), or None."""
    stop = data.find(b'"', start, end)
    while stop > start and data[stop - 1] == 0x5C:  # a backslash before the quote: count them
        slashes = len(data[start:stop]) - len(data[start:stop].rstrip(b"\\"))
        if slashes % 2 == 0:
            break
        stop = data.find(b'"', stop + 1, end)
    if stop <= start:
        return None
    text = data[start:stop].decode()
    return json.loads(f'"{text}"') if "\\" in text else text


def video_id_of(line: str) -> str | None:
    """The video id of an entry's line, found as json.dumps writes it (None when it is not there)."""
    at = line.find(_ID)
    if at < 0:
        return None
    at += len(_ID)
    end = line.find('"', at)
    return line[at:end] if end > at and "\\" not in line[at:end] else None


def merged(line: str, fields: str | None) -> str:
    """An entry's line with the fields a run's end recorded (``outcomes``) set over its own."""
    return line if fields is None else json.dumps({**json.loads(line), **json.loads(fields)})


def pairs(out_dir: Path) -> Iterator[tuple[str, str | None]]:
    """Each video's entry line, in manifest order, with the fields a run's end recorded of it that the
    manifest does not hold yet (None: none): for readers that look into both without parsing either."""
    recorded = outcomes(out_dir)
    for line in _own_lines(out_dir):
        if not recorded:
            yield line, None
            continue
        vid = video_id_of(line)
        if vid is None:
            vid = json.loads(line).get("video_id")
        yield line, recorded.get(vid)


def head(out_dir: Path) -> dict[str, Any]:
    """The manifest's keys but its videos (one line read when this version wrote it); {} without one."""
    try:
        with open(out_dir / MANIFEST, encoding="utf-8") as fh:
            first = fh.readline().rstrip("\n")
            if first.endswith(TAIL):
                return dict(json.loads(first[: -len(TAIL)] + "}"))
    except (OSError, ValueError):
        return {}
    whole = _whole(out_dir)
    whole.pop("videos", None)
    return whole


_head = head  # for Writer, whose argument of that name is the new head


def lines(out_dir: Path) -> Iterator[str]:
    """Each video's entry as a line of JSON, in manifest order (see the module), with what the runs' ends
    recorded of it; none without a manifest."""
    for line, fields in pairs(out_dir):
        yield merged(line, fields)


def _own_lines(out_dir: Path) -> Iterator[str]:
    """The manifest file's own entry lines, in manifest order."""
    path = out_dir / MANIFEST
    if head(out_dir).get("order") != ORDER:
        yield from (json.dumps(e) for e in sorted(_whole(out_dir).get("videos", []), key=sort_key))
        return
    try:
        fh = open(path, encoding="utf-8")
    except OSError:
        return
    with fh:
        fh.readline()
        for raw in fh:
            line = raw.rstrip("\n")
            if line in ("", "]}"):
                continue
            yield line[:-1] if line.endswith(",") else line


class _Earlier:
    """The earlier manifest's lines, one at a time, each parsed only when its key is asked for."""

    def __init__(self, out_dir: Path) -> None:
        self._lines = lines(out_dir)
        self.line: str | None = None
        self._entry: dict[str, Any] | None = None
        self.advance()

    def advance(self) -> None:
        self.line, self._entry = next(self._lines, None), None

    def entry(self) -> dict[str, Any]:
        if self._entry is None:
            self._entry = json.loads(self.line or "{}")
        return self._entry

    def key(self) -> tuple[str, tuple[str, ...]]:
        return sort_key(self.entry())


class Writer:
    """Writes OUT/manifest.json anew: ``head``, then the earlier entries merged with those given to ``add``
    (in manifest order). What an earlier run recorded of a video (status, provenance, quality) stays;
    the fields ``add`` gives replace theirs. ``commit`` puts the file in place; ``abort`` drops it."""

    def __init__(self, out_dir: Path, head: dict[str, Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / MANIFEST
        # Written in OUT/runs/ (a file per run), not OUT (a file per video: a million to list for the
        # part an enqueuer killed mid-way left), and moved into place: one file system, one rename.
        parts = out_dir / PARTS
        parts.mkdir(exist_ok=True)
        for stale in parts.glob(f".{MANIFEST}.*.tmp"):
            stale.unlink(missing_ok=True)
        self.tmp = parts / f".{MANIFEST}.{uuid.uuid4().hex[:8]}.tmp"
        # The runs' outcomes files merged into this manifest, and those named before whose file is still there.
        self.folds = outcome_runs(out_dir)
        earlier = _head(out_dir).get(FOLDED) or []
        folded = [run for run, _path in self.folds]
        folded += [run for run in earlier if run not in folded and _outcomes_left(out_dir, run)]
        self.earlier = _Earlier(out_dir)
        self.fh = open(self.tmp, "w", encoding="utf-8")
        top = {**{k: v for k, v in head.items() if k not in ("videos", FOLDED)}, "order": ORDER}
        if folded:
            top[FOLDED] = sorted(folded)
        self.fh.write(json.dumps(top)[:-1] + TAIL)
        self.written = 0

    def _write(self, line: str) -> None:
        self.fh.write(",\n" + line if self.written else "\n" + line)
        self.written += 1

    def add(self, entry: dict[str, Any]) -> None:
        """Add ``entry`` (the next in manifest order) over the earlier entry of the same root and path."""
        line = json.dumps(entry)
        old = self.earlier
        if old.line is None:  # past the earlier entries (or none: a new folder)
            self._write(line)
            return
        # The same video with the same fields, as every video of a --continue is: the earlier line as it is.
        if old.line.startswith(line[:-1]) and old.line[len(line) - 1 : len(line)] in ",}":
            self._write(old.line)
            old.advance()
            return
        key = sort_key(entry)
        while old.line is not None and old.key() < key:
            self._write(old.line)
            old.advance()
        if old.line is not None and old.key() == key:
            line = json.dumps({**old.entry(), **entry})
            old.advance()
        self._write(line)

    def commit(self) -> None:
        """Write the earlier entries left, and replace the manifest with the new file (fsynced)."""
        old = self.earlier
        while old.line is not None:
            self._write(old.line)
            old.advance()
        self.fh.write("\n]}\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.tmp, self.path)
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        for _run, path in self.folds:  # the manifest holds them now (and names them: one left behind is ignored)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def abort(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)

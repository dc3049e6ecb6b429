"""OUT/manifest.json read and written as a stream: its head on the first line, then one video a line.

A manifest this version writes says ``"order": "parts"``: its videos are sorted by (root, path parts),
the order in which tasks.run.listing walks a folder, so a run merges the earlier entries with the
videos it lists in one pass over each, holding neither in memory. The new file is written beside the
old one (in OUT/runs/) and replaces it at the end (an enqueuer that dies mid-way leaves the earlier
manifest, and its part, which the next run removes). A
manifest of an earlier version (another order, or indented JSON) is read whole once and sorted.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
ORDER = "parts"
TAIL = ', "videos": ['  # what ends the head's line (tasks.run.lineage.write writes the same)
PARTS = "runs"  # the folder the new manifest is written in before it replaces the old (tasks.run.runs.FOLDER)


def sort_key(entry: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """Where an entry sits in the manifest: its root ("" for the first run's), then its path's parts."""
    return entry.get("root", ""), tuple(entry["path"].split("/"))


def read(out_dir: Path) -> dict[str, Any]:
    """The whole manifest of ``out_dir`` (every video's entry in memory), or {} when there is none."""
    try:
        return dict(json.loads((out_dir / MANIFEST).read_text()))
    except (OSError, ValueError):
        return {}


def head(out_dir: Path) -> dict[str, Any]:
    """The manifest's keys but its videos (one line read when this version wrote it); {} without one."""
    try:
        with open(out_dir / MANIFEST, encoding="utf-8") as fh:
            first = fh.readline().rstrip("\n")
            if first.endswith(TAIL):
                return dict(json.loads(first[: -len(TAIL)] + "}"))
    except (OSError, ValueError):
        return {}
    whole = read(out_dir)
    whole.pop("videos", None)
    return whole


def lines(out_dir: Path) -> Iterator[str]:
    """Each video's entry as a line of JSON, in manifest order (see the module); none without a manifest."""
    path = out_dir / MANIFEST
    if head(out_dir).get("order") != ORDER:
        yield from (json.dumps(e) for e in sorted(read(out_dir).get("videos", []), key=sort_key))
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
        self.earlier = _Earlier(out_dir)
        self.fh = open(self.tmp, "w", encoding="utf-8")
        self.fh.write(json.dumps({**{k: v for k, v in head.items() if k != "videos"}, "order": ORDER})[:-1] + TAIL)
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

    def abort(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)

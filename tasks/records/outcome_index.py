"""A run's outcomes segment's index (tasks.records.outcome_files): a row per line, written after the line by the
process that alone appends to both: the video's id, its status, and the segment's size after the line (tab
separated), so that the run's end reads a million videos' ids and statuses from 35 MB rather than the 781 MB
of their lines, and a line where its row says. A line without a row (a worker stopped between the two) is
the segment's tail past its last row; an index that does not describe its segment is not used."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from tasks.records.manifest import SEGMENT

INDEX = ".index"  # beside a segment: <host>-<pid>-<token>.index
# A whole line (a killed writer leaves a last line without its newline): id, tab, fields starting with the status.
LINE = re.compile(r'^([^\t\n]+)\t\{"status": "([a-z_]+)"[^\n]*\}\n', re.M)
_ROW = re.compile(r"([^\t\n]+)\t([a-z_]+)\t[0-9]+\n")  # a row (id, status): each begins a line


def row_of(video_id: str, status: str, end: int) -> str:
    return f"{video_id}\t{status}\t{end}\n"


def index_of(lines: Sequence[str]) -> str:
    """The index rows of a segment written as ``lines`` (whole lines, in order), as tasks.records.outcome_files.append
    writes them."""
    rows, end = [], 0
    for line in lines:
        end += len(line.encode())
        vid, _, text = line.partition("\t")
        status = text[12 : text.index('"', 12)]  # {"status": "<status>"
        rows.append(row_of(vid, status, end))
    return "".join(rows)


def indexed(path: Path, wanted: Collection[str] | None, fields: dict[str, str] | None) -> list[tuple[str, str]] | None:
    """``read``'s part for one segment from its index (about 4 % of its size): the ids and statuses of its
    rows, then the lines after the last row (a worker stopped between the line and its row) from the segment;
    with ``fields``, those of the wanted and low_quality videos read at their offsets. None (read the segment)
    without an index, or with one that does not describe the segment."""
    try:
        raw = path.with_name(path.name[: -len(SEGMENT)] + INDEX).read_text(encoding="utf-8")
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    raw = raw[: raw.rfind("\n") + 1]  # a torn last row: not written whole, its line is read from the segment
    found = _ROW.findall(raw)
    if len(found) != raw.count("\n"):
        return None
    covered = int(raw[raw.rfind("\t") + 1 : -1]) if raw else 0
    if covered > size:
        return None
    with open(path, "rb") as fh:
        if fields is not None and not _fetch(fh, raw, found, wanted or (), fields):
            return None
        if covered == size:
            return found
        fh.seek(covered)
        tail = fh.read().decode("utf-8")
    more = LINE.findall(tail)
    if fields is not None:
        keep(tail, more, wanted or (), fields)
    return found + more


def _fetch(fh: Any, raw: str, found: list[tuple[str, str]], wanted: Collection[str], fields: dict[str, str]) -> bool:
    """Put in ``fields`` the lines of ``found``'s wanted and low_quality videos, read where the index ``raw``
    says they are (a row's line ends where the row says, and begins where the row before it ends); False
    when a line read there is not that video's."""
    at = 0  # where the search of rows goes on
    for vid, status in [pair for pair in found if pair[1] == "low_quality" or pair[0] in wanted]:
        head = vid + "\t" + status + "\t"
        start = raw.find(head, at)
        while start > 0 and raw[start - 1] != "\n":  # another id ending in this one
            start = raw.find(head, start + 1)
        if start < 0:
            return False
        begin = int(raw[raw.rfind("\t", 0, start - 1) + 1 : start - 1]) if start else 0
        end = raw.index("\n", start)
        stop = int(raw[raw.rindex("\t", start, end) + 1 : end])
        fh.seek(begin)
        line = fh.read(stop - begin).decode("utf-8")
        if not line.startswith(vid + "\t") or LINE.fullmatch(line) is None:
            return False
        fields[vid] = line[len(vid) + 1 : -1]
        at = end + 1
    return True


def keep(text: str, found: list[tuple[str, str]], wanted: Collection[str], fields: dict[str, str]) -> None:
    """Put in ``fields`` the fields of each line of ``text`` (a segment; ``found``: its lines' ids and statuses,
    in order) whose video is ``wanted`` or whose status is low_quality: each found by a search forward from
    the one before, so the segment is scanned once at most."""
    at = 0
    for vid, status in [pair for pair in found if pair[1] == "low_quality" or pair[0] in wanted]:
        head = vid + "\t"
        while True:  # the next whole line of this video (a torn line or another id's tail is passed over)
            start = text.find(head, at)
            if start < 0:
                return
            if (start == 0 or text[start - 1] == "\n") and (line := LINE.match(text, start)) is not None:
                break
            at = start + 1
        at = line.end()
        if status == "low_quality" or vid in wanted:
            fields[vid] = text[start + len(head) : at - 1]

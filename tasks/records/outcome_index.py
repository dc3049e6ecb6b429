"""A run's outcomes segment's index (tasks.records.outcome_files): a row per line, written after the line by the
process that alone appends to both: the video's id, its status, and the segment's size after the line (tab
separated), so that the run's end reads a million videos' ids and statuses from 35 MB rather than the 781 MB
of their lines, and a line where its row says. A line without a row (a worker stopped between the two) is
the segment's tail past its last row; an index that does not describe its segment is not used."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from tasks.records.manifest import SEGMENT

INDEX = ".index"  # beside a segment: <host>-<pid>-<token>.index
HEAD = '{"video_id": "'  # how a line begins (tasks.records.outcome_files.line_of): its id and status come first
# A whole line (a killed writer leaves a last line without its newline): a JSON object whose first keys are the
# id and the status, or an earlier version's line (id, tab, the fields starting with the status). Groups: the
# id of a line of this version, the id of an earlier version's line, the status.
# The id as json.dumps writes it: escapes only where an id holds a quote or a backslash (ids the job gate lets in
# hold neither; a manifest of an earlier version or edited by hand may).
LINE = re.compile(
    r'^(?:\{"video_id": "([^"\\\n]*(?:\\.[^"\\\n]*)*)", |([^\t\n]+)\t\{)"status": "([a-z_]+)"[^\n]*\}\n', re.M
)
_ROW = re.compile(r"([^\t\n]+)\t([a-z_]+)\t[0-9]+\n")  # a row (id, status): each begins a line


def pairs(text: str) -> list[tuple[str, str]]:
    """(id, status) of each whole line of ``text`` (a segment or its tail), of either form, in order."""
    return [(_unescaped(vid) if vid else old, status) for vid, old, status in LINE.findall(text)]


def id_of(line: re.Match[str]) -> str:
    """The video id of a line ``LINE`` matched."""
    return _unescaped(line.group(1)) if line.group(1) else line.group(2)


def _unescaped(vid: str) -> str:
    """An id as a line of this version holds it, as the id (json.dumps escaped a quote or a backslash in it)."""
    return json.loads(f'"{vid}"') if "\\" in vid else vid


def fields_text(line: str) -> str:
    """The fields (JSON text) a whole line (without its newline) sets over its video's manifest entry: the line
    itself, or what follows an earlier version's tab."""
    return line if line.startswith(HEAD) else line.partition("\t")[2]


def row_of(video_id: str, status: str, end: int) -> str:
    return f"{video_id}\t{status}\t{end}\n"


def index_of(lines: Sequence[str]) -> str:
    """The index rows of a segment written as ``lines`` (whole lines, in order), as tasks.records.outcome_files.append
    writes them."""
    rows, end = [], 0
    for line in lines:
        end += len(line.encode())
        found = LINE.match(line)
        if found is None:
            raise ValueError(f"not a whole outcomes line: {line[:80]!r}")
        rows.append(row_of(id_of(found), found.group(3), end))
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
    more = pairs(tail)
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
        whole = LINE.fullmatch(line)
        if whole is None or id_of(whole) != vid:
            return False
        fields[vid] = fields_text(line[:-1])
        at = end + 1
    return True


def keep(text: str, found: list[tuple[str, str]], wanted: Collection[str], fields: dict[str, str]) -> None:
    """Put in ``fields`` the fields of each line of ``text`` (a segment; ``found``: its lines' ids and statuses,
    in order) whose video is ``wanted`` or whose status is low_quality: each found by a search forward from
    the one before, so the segment is scanned once at most."""
    at, ours = 0, text.startswith(HEAD)
    for vid, _status in [pair for pair in found if pair[1] == "low_quality" or pair[0] in wanted]:
        # Its line as this version writes it or as an earlier one did: the form of the segment's first line
        # searched for first, the other only up to where that one is (a search to the end for each video
        # would read the segment again for each).
        first, other = (HEAD + vid + '", ', vid + "\t") if ours else (vid + "\t", HEAD + vid + '", ')
        while True:  # the next whole line of this video (a torn line or another id's tail is passed over)
            start = text.find(first, at)
            before = text.find(other, at, start if start >= 0 else len(text))
            start = before if before >= 0 else start
            if start < 0:
                return
            line = LINE.match(text, start) if start == 0 or text[start - 1] == "\n" else None
            if line is not None and id_of(line) == vid:
                break
            at = start + 1
        at = line.end()
        fields[vid] = fields_text(text[start : at - 1])

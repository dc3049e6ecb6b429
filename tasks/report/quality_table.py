"""The report's quality table (tasks.report.report_quality.recorded) from what a run's end read of its outcomes
lines (tasks.records.outcome_files.read): the same videos and count without a second read of the lines, and the
manifest read once with its lines' ids found in C. The end hands the table to the report's process."""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path
from typing import Any

from tasks.records import manifest
from tasks.records.outcome_files import Lines
from tasks.report.report_quality import MAX_ROWS


def wanted(out: Path, rows: int = MAX_ROWS) -> set[str]:
    """The ids of the manifest's first ``2 * rows`` entries: the videos whose outcomes lines ``chosen`` may
    show (besides the low_quality ones), asked of the run's end as it reads them."""
    found: set[str] = set()
    for line in manifest._own_lines(out):
        if len(found) >= 2 * rows:
            break
        vid = manifest.video_id_of(line)
        found.add(vid if vid is not None else str(json.loads(line).get("video_id")))
    return found


class _Unknown(Exception):
    """The table needs the fields of a video the run's end did not keep."""


_ID = re.compile(r'\n\{"video_id": "([^"\\\n]*)"')  # an entry line's id after its newline, as json.dumps writes it
CHUNK_BYTES = 1 << 25
LOW = '"status": "low_quality"'


def chosen(out: Path, run_id: str, lines: Lines, rows: int = MAX_ROWS) -> tuple[list[dict[str, Any]], int] | None:
    """``recorded(out, rows)`` from what the end of ``run_id`` read of its outcomes lines (``lines``, with the
    fields of ``wanted(out, rows)``'s videos and of the low_quality ones): the manifest is read once, its
    lines' ids found in C, and a line is parsed only when the table shows it. None (the report then takes
    ``recorded``'s pass) when another run's outcomes are merged over the manifest, the manifest is of an
    earlier version's format, its first entries are mostly of videos not in the run (a --continue: the pass
    costs no more), or the table shows a video of the run whose fields were not kept."""
    if lines.fields is None or [rid for rid, _p in manifest.outcome_runs(out)] != [run_id]:
        return None
    if manifest.head(out).get("order") != manifest.ORDER:
        return None
    first = wanted(out, rows)
    if sum(vid in lines.status for vid in first) * 2 < len(first):
        return None  # mostly videos of other runs (a --continue): ``recorded``'s pass costs no more
    for same in (True, False):
        try:
            return _read(out, lines, rows, same)
        except _Restart:
            continue
        except (OSError, _Unknown):
            return None
    return None


class _Restart(Exception):
    """The manifest's videos are not the run's: read it again, looking each one up."""


def _read(out: Path, lines: Lines, rows: int, same: bool) -> tuple[list[dict[str, Any]], int]:
    """``chosen``'s read of the manifest; ``same``: taking its videos to be the run's, each line's status is
    not looked up (a million lookups in a dict of a million: 0.45 s), and that is checked at the end: as
    many videos, and the same sum of their ids' hashes (SipHash, keyed per process: the odds of two sets
    agreeing by chance are about 2**-64), else ``_Restart``."""
    found: list[tuple[int, dict[str, Any]]] = []
    state = {"others": 0, "count": 0, "at": 0, "hashes": 0}
    low = {vid for vid, status in lines.status.items() if status == "low_quality"} if same else None
    with open(out / manifest.MANIFEST, "rb") as fh:
        fh.readline()
        rest = b"\n"  # each chunk: a newline, then whole lines without the last newline (the next chunk's)
        while data := fh.read(CHUNK_BYTES):
            block = rest + data
            cut = block.rfind(b"\n")
            _chunk(codecs.utf_8_decode(memoryview(block)[:cut], "strict", True)[0], lines, found, state, rows, low)
            rest = block[cut:]
        _chunk(rest.decode(), lines, found, state, rows, low)
    if same and (state["at"] != len(lines.status) or state["hashes"] != sum(map(hash, lines.status))):
        raise _Restart
    return [entry for _at, entry in sorted(found, key=lambda pair: pair[0])], state["count"]


def _chunk(
    text: str,
    lines: Lines,
    found: list[tuple[int, dict[str, Any]]],
    state: dict[str, int],
    rows: int,
    low: set[str] | None = None,
) -> None:
    """Add to ``found`` (manifest index, entry) what ``recorded`` takes of the manifest lines in ``text`` (a
    newline, then whole lines), and count them in ``state``. ``low``: the run's low_quality videos, when every
    line is taken to be a video of the run (``_read``)."""
    status = lines.status
    ids = _ID.findall(text)
    entries = text.count("\n") - text.endswith("\n]}") - text.endswith("\n")  # the manifest's last line: "]}"
    base = state["at"]
    if low is not None:
        if len(ids) != entries:
            raise _Restart
        _same(text, ids, lines, found, state, rows, low)
        return
    if len(ids) != entries:  # lines of another shape: each looked at as ``recorded`` does
        for line in text[1:].splitlines():
            if line in ("", "]}"):
                continue
            line = line[:-1] if line.endswith(",") else line
            vid = manifest.video_id_of(line)
            _line(
                state["at"],
                line,
                vid if vid is not None else json.loads(line).get("video_id"),
                lines,
                found,
                state,
                rows,
            )
            state["at"] += 1
        return
    state["at"] += len(ids)
    known = list(map(status.get, ids))  # each line's video's status in the run (None: no video of the run)
    strangers = known.count(None)
    if not base and strangers * 2 > len(ids):
        raise _Unknown("most of the manifest's videos are not the run's")  # recorded's pass costs no more then
    texts: list[str] | None = None
    k = 0
    if strangers or state["others"] < rows:
        texts = text[1:].split("\n", len(ids))[: len(ids)]
        while k < len(ids) and state["others"] < rows:  # the first ``rows`` others and the lows among them
            _line(base + k, texts[k], ids[k], lines, found, state, rows)
            k += 1
    if k == len(ids):
        return
    special = _at(known, "low_quality", k)  # shown: every low_quality video, of the run or not
    if strangers and texts is not None:
        special += [j for j in _lines_with(text, LOW, k) if known[j] is None]
        counted = sum(
            1 if st is not None else ('"status": ' in line or '"quality": ' in line)
            for st, line in zip(known[k:], texts[k:], strict=True)
        )
    else:
        counted = len(ids) - k  # every line a video of the run: each has a status
    state["count"] += counted - len(special)  # each shown line has a status: ``_line`` counts it
    if special and texts is None:
        texts = text[1:].split("\n", len(ids))[: len(ids)]
    for j in sorted(special):
        _line(base + j, texts[j] if texts is not None else "", ids[j], lines, found, state, rows)


def _same(
    text: str,
    ids: list[str],
    lines: Lines,
    found: list[tuple[int, dict[str, Any]]],
    state: dict[str, int],
    rows: int,
    low: set[str],
) -> None:
    """``_chunk`` for lines taken to be videos of the run: the first lines looked up until ``rows`` others are
    shown, then only the low_quality ones (of ``low``: a small set) found and shown."""
    base = state["at"]
    state["at"] += len(ids)
    state["hashes"] += sum(map(hash, ids))
    texts: list[str] | None = None
    k = 0
    while k < len(ids) and state["others"] < rows:
        if ids[k] not in lines.status:
            raise _Restart
        texts = texts or text[1:].split("\n", len(ids))[: len(ids)]
        _line(base + k, texts[k], ids[k], lines, found, state, rows)
        k += 1
    special = [j for j in range(k, len(ids)) if ids[j] in low] if low else []
    state["count"] += len(ids) - k - len(special)  # each line has a status (its video's outcomes line)
    if special:
        texts = texts or text[1:].split("\n", len(ids))[: len(ids)]
    for j in special:
        _line(base + j, texts[j] if texts is not None else "", ids[j], lines, found, state, rows)


def _at(values: list[Any], value: Any, start: int) -> list[int]:
    """The indices from ``start`` on where ``values`` holds ``value`` (list.index: C)."""
    found: list[int] = []
    while True:
        try:
            start = values.index(value, start)
        except ValueError:
            return found
        found.append(start)
        start += 1


def _lines_with(text: str, needle: str, start: int) -> list[int]:
    """The indices (from ``start`` on) of ``text``'s lines, after its first newline, that hold ``needle``."""
    found: list[int] = []
    at, line = 0, 0
    while (hit := text.find(needle, at)) >= 0:
        line += text.count("\n", at, hit)
        index = line - 1  # text starts with the newline before line 0
        if index >= start and (not found or found[-1] != index):
            found.append(index)
        at = hit + len(needle)
    return found


def _line(
    at: int,
    line: str,
    vid: str | None,
    lines: Lines,
    found: list[tuple[int, dict[str, Any]]],
    state: dict[str, int],
    rows: int,
) -> None:
    """``recorded``'s step for manifest line ``at``."""
    line = line[:-1] if line.endswith(",") else line
    recorded_status = lines.status.get(vid) if vid is not None else None
    fields = None
    low = LOW in line if recorded_status is None else recorded_status == "low_quality"
    if not low and state["others"] >= rows:
        state["count"] += recorded_status is not None or any(k in line for k in ('"status": ', '"quality": '))
        return
    if recorded_status is not None:
        fields = (lines.fields or {}).get(vid or "")
        if fields is None:
            raise _Unknown(vid)
    entry = json.loads(manifest.merged(line, fields))
    if entry.get("quality") or entry.get("status"):
        state["count"] += 1
        found.append((at, entry))
        state["others"] += entry.get("status") != "low_quality"

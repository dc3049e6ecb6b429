"""A run's outcomes files: each finished video's status, quality and provenance as a line of JSON in OUT/runs/
(``{"video_id": …, "status": …, "quality": …}``: its id and status first, so the run's end finds both without
parsing the line, and the files load in DuckDB or pandas as JSON Lines), appended by the task that ends the
video, so that the run's end reads no video's outcome. Lines an earlier version wrote (the id, a tab, the
fields) are read as well.

While the run is live its lines go to OUT/runs/<run>.outcomes.live/<host>-<pid>-<token>.jsonl, a file per
worker process (one writer per file: a line is one ``write`` to a file opened O_APPEND, on one host or
many over a shared OUT), and a video's notes, when it has any, to <...>.notes beside it (a line of JSON,
``{"video_id": …, "notes": …}``; an earlier version's <...>.notes.jsonl are read too); after the line,
its row in the segment's index, <...>.index (id, status, the segment's size after the line: about 4 % of the
line), so that the run's end reads a million videos' ids and statuses from 35 MB rather than 781 MB. A line
whose row is missing (a worker stopped between the two, or a row that could not be written: that process's
next lines go to new files) is a segment's tail past its last row, read from the segment. The line
is written before the video is counted in Redis (tasks.run.completion): a counted video always has its
line, and a task killed in between writes it again when it is delivered again, so a video may have
several lines; readers take one. The run's end (``close``) checks the lines against what Redis counted,
writes the lines that settle a video whose lines disagree to ``END`` (read last), and renames the
folder to OUT/runs/<run>.outcomes/, which tasks.records.manifest's readers merge over the manifest (a live
run's lines are not merged: a concurrent enqueue's fold would leave out those written after it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.outputs.storage import write_text_atomic
from tasks.records import manifest
from tasks.records.outcome_index import HEAD, INDEX, LINE, fields_text, id_of, indexed, keep, row_of
from tasks.records.outcome_index import pairs as pairs_of

log = logging.getLogger("framefleet.outcomes")
LIVE = ".live"  # OUT/runs/<run>.outcomes.live/: the run's segments while it is live
SEGMENT, NOTES, segments = manifest.SEGMENT, manifest.NOTES, manifest.segments
END = "~end.jsonl"  # the end's own lines: "~" sorts after any host name, so it is read last
STATUSES = ("done", "low_quality", "failed")


def live_dir(out_dir: Path, run_id: str) -> Path:
    final = manifest.outcomes_path(out_dir, run_id)
    return final.with_name(final.name + LIVE)


def fields_of(status: str, found: dict[str, Any]) -> dict[str, Any]:
    """The fields a video's line sets over its manifest entry: ``found`` is its dataset stage's report
    ("done"), the quality gate's detail ("low_quality") or nothing ("failed")."""
    if status == "done":
        fields: dict[str, Any] = {"status": "done", "quality": found.get("quality", {})}
        if found.get("provenance"):
            fields["provenance"] = _short(found["provenance"])
        return fields
    if status == "low_quality":
        return {"status": status, "quality": found.get("quality", {}), "shortfalls": found.get("shortfalls", [])}
    return {"status": "failed"}


def line_of(video_id: str, status: str, found: dict[str, Any]) -> str:
    """The video's line: a JSON object whose first keys are ``video_id`` and ``status`` (so the run's end finds
    both without parsing it, and the lines load as JSON Lines), then the fields ``fields_of`` gives."""
    return json.dumps({"video_id": video_id, **fields_of(status, found)}) + "\n"


def append(out_dir: Path, run_id: str, video_id: str, status: str, found: dict[str, Any], notes: Any = None) -> None:
    """Append ``video_id``'s line (and its notes, if any) to this process's segment of the live run.
    Raises OSError (the caller retries: a second line of the same video is harmless)."""
    from tasks.statistics.partials import process_name

    folder = live_dir(out_dir, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    with _WRITING:  # a thread's index row follows its own line
        name = process_name() + (f"-{_SPLIT[0]}" if _SPLIT[0] else "")
        end = _append_line(folder / (name + SEGMENT), line_of(video_id, status, found))
        try:
            _append_line(folder / (name + INDEX), row_of(video_id, status, end))
        except OSError:
            _SPLIT[0] += 1  # this process's next lines go to new files: a line without its row stays a tail
            raise
    if notes:
        _append_line(folder / (name + NOTES), json.dumps({"video_id": video_id, "notes": notes}) + "\n")


_WRITING = threading.Lock()
_SPLIT = [0]  # how often this process's index row could not be written


def _append_line(path: Path, line: str) -> int:
    """Append ``line`` in one write; return the file's size after it (this process alone appends to it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(fd, line.encode())  # one write: a reader sees the whole line or none (or a torn last one)
        return os.lseek(fd, 0, os.SEEK_CUR)
    finally:
        os.close(fd)


def notes_of(folder: Path) -> dict[str, Any]:
    """Video id -> the notes of its newest outcome with notes, from the run's notes segments."""
    found: dict[str, Any] = {}
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith((NOTES, manifest.LEGACY_NOTES)) and n[:1] != ".")
    except (FileNotFoundError, NotADirectoryError):
        return found
    for name in names:
        for raw in (folder / name).read_text(encoding="utf-8").splitlines():
            vid, tab, text = raw.partition("\t")  # an earlier version's line: id, tab, the notes
            try:
                if tab:
                    found[vid] = json.loads(text)
                elif raw.startswith(HEAD):
                    line = json.loads(raw)
                    found[line["video_id"]] = line["notes"]
            except (ValueError, KeyError):
                continue  # a line cut short by a killed writer
    return found


@dataclass
class Lines:
    """What a run's segments say: each video's status (a "done" line outranks the others, as the count in
    Redis does; else the last line read), and the videos whose lines disagree; ``fields``: the fields (JSON
    text) of the last whole line read of each video asked for and of each video with a low_quality line
    (its last such line), when ``read`` was asked for them (the report's quality table)."""

    status: dict[str, str] = field(default_factory=dict)
    disagree: set[str] = field(default_factory=set)
    fields: dict[str, str] | None = None


def read(folder: Path, wanted: Collection[str] | None = None) -> Lines:
    """The status of every video with a line in ``folder``'s segments (ids and statuses only: no JSON parsed);
    with ``wanted`` (video ids), also the ``fields`` of those videos and of the low_quality ones, found in
    the same read of each segment."""
    pairs: list[tuple[str, str]] = []
    fields: dict[str, str] | None = None if wanted is None else {}
    for path in segments(folder):
        found_here = indexed(path, wanted, fields)
        if found_here is not None:
            pairs += found_here
            continue
        text = path.read_text(encoding="utf-8")
        found = pairs_of(text)
        if fields is not None:
            keep(text, found, wanted or (), fields)
        pairs += found
    lines = Lines(dict(pairs), fields=fields)  # the last line of each video (a million: a dict made in C)
    if len(lines.status) == len(pairs):
        return lines  # a line per video: nothing to settle
    seen: dict[str, str] = {}
    for vid, now in pairs:  # videos with several lines (a redelivered end): done outranks the others
        was = seen.setdefault(vid, now)
        if was != now:
            lines.disagree.add(vid)
            if was != "done":
                seen[vid] = now
    for vid in lines.disagree:
        lines.status[vid] = seen[vid]
    return lines


def close(
    out_dir: Path,
    run_id: str,
    failed: list[dict[str, Any]],
    extra: Sequence[str] = (),
    wanted: Collection[str] | None = None,
) -> tuple[Path, Lines]:
    """End the run's outcomes: settle each video whose lines disagree with each other or with the failure
    records Redis holds (``failed``) in the end's own segment, with ``extra`` lines (an earlier version's
    outcomes), and rename the folder to where the manifest's readers find it. Return the folder and its
    lines as read (the settled statuses in; with ``wanted``, their ``fields`` as ``read`` gives them, the end's
    own lines last). A second call (the callback delivered again) reads the renamed folder. Raises OSError."""
    final = manifest.outcomes_path(out_dir, run_id)
    live = live_dir(out_dir, run_id)
    folder = live if live.exists() or not final.exists() else final
    lines = read(folder, wanted)
    # Rare: a video ended twice in the run with other statuses; the line of the status that counts goes last.
    settled = _winners(folder, {vid: lines.status[vid] for vid in lines.disagree}) if lines.disagree else {}
    for record in failed:
        vid, status = record["video_id"], "low_quality" if record.get("detail") else "failed"
        if lines.status.get(vid) != status or vid in settled:
            settled[vid] = line_of(vid, status, dict(record.get("detail") or {}))
            lines.status[vid] = status
    if settled or extra:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / END, "".join(extra) + "".join(settled[v] for v in sorted(settled)))
        for line in extra:
            found = LINE.match(line)
            if found is not None:
                lines.status[id_of(found)] = found.group(3)
        if lines.fields is not None:  # the end's own segment is read last: its lines are the videos' last
            for line in [*extra, *(settled[v] for v in sorted(settled))]:
                found = LINE.match(line)
                if found is not None:
                    lines.fields[id_of(found)] = fields_text(line.rstrip("\n"))
    if folder == live:
        _rename(live, final)
    return final, lines


def adopt_lost(out_dir: Path, known: Callable[[str], bool]) -> list[tuple[str, int]]:
    """End the outcomes of each run whose live folder is in OUT/runs/ but which Redis no longer knows
    (``known(run_id)`` False: flushed, or restarted without persistence), as ``close`` would with no failure
    records: such a run can never end, and without this the videos it finished would have no status, quality
    or provenance in the manifest. Return (run id, videos) for each. Raises OSError."""
    try:
        names = sorted(os.listdir(out_dir / manifest.PARTS))
    except FileNotFoundError:
        return []
    ending = manifest.OUTCOMES + LIVE
    adopted = []
    for name in names:
        run_id = name[: -len(ending)]
        if name.endswith(ending) and run_id and not name.startswith(".") and not known(run_id):
            _final, lines = close(out_dir, run_id, [])
            adopted.append((run_id, len(lines.status)))
    return adopted


def _rename(live: Path, final: Path) -> None:
    """Put the live folder's files in the run's final folder: one rename (a reader sees the live run's
    lines or all of them), file by file when the final folder exists (the end ran before)."""
    live.mkdir(parents=True, exist_ok=True)  # a run without any line (its videos counted by an earlier version)
    if not final.exists():
        os.replace(live, final)
        return
    for name in os.listdir(live):
        os.replace(live / name, final / name)
    live.rmdir()


def _winners(folder: Path, wanted: dict[str, str]) -> dict[str, str]:
    """Video id -> its last whole line with the status ``wanted`` gives it, in ``folder``'s segments."""
    found: dict[str, str] = {}
    for path in segments(folder):
        for match in LINE.finditer(path.read_text(encoding="utf-8")):
            if wanted.get(id_of(match)) == match.group(3):
                found[id_of(match)] = match.group(0)
    return found


def _short(prov: dict[str, Any]) -> dict[str, Any]:
    return {
        "backends": prov.get("backends", {}),
        "settings_sha256": prov.get("settings_sha256"),
        "framefleet": prov.get("framefleet", {}).get("version"),
        "source_sha256": prov.get("source", {}).get("sha256"),
        "run_id": prov.get("run_id"),
    }

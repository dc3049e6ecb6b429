"""The report's per-video quality table: each video's status, quality, missed gates and preview."""

from __future__ import annotations

import html
import json
import logging
import re
from pathlib import Path
from typing import Any

from tasks.run import manifest
from tasks.run.outcome_files import Lines
from tasks.stages import DepthStage, HandsStage, TracksStage

log = logging.getLogger("framefleet.report")
PREVIEW_WIDTH_PX = 320
MAX_ROWS = 200  # videos in the table (a preview each); every low_quality one is shown
# Columns: (stage, measure, heading, format).
COLUMNS = (
    (TracksStage.name, "visible_fraction", "tracks visible", "{:.2f}"),
    (TracksStage.name, "median_track_length", "track length (frames)", "{:g}"),
    (HandsStage.name, "left_frame_fraction", "left hand", "{:.2f}"),
    (HandsStage.name, "right_frame_fraction", "right hand", "{:.2f}"),
    (HandsStage.name, "confidence", "hand score", "{:.2f}"),
    (DepthStage.name, "camera", "camera", "{}"),
    (DepthStage.name, "flat_frame_pct", "flat depth %", "{:.1f}"),
)


def _cell(quality: dict[str, Any], stage: str, measure: str, fmt: str) -> str:
    value = (quality.get(stage) or {}).get(measure)
    return "–" if value is None else html.escape(fmt.format(value))


def preview(out: Path, video_id: str) -> str | None:
    """A preview PNG of the video in OUT/report/previews/ (relative path), or None without its intermediates."""
    from tasks.outputs.preview import write_preview

    rel = Path("report") / "previews" / f"{video_id}.png"
    try:
        write_preview(out, video_id, out / rel, PREVIEW_WIDTH_PX)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a preview is not worth losing the report
        log.warning("no preview of %s: %s", video_id, exc)
        return None
    return rel.as_posix()


def recorded(out: Path, rows: int = MAX_ROWS) -> tuple[list[dict[str, Any]], int]:
    """(the table's entries in manifest order: every low_quality video and the first ``rows`` others;
    how many videos the manifest records a status or quality of), in one pass over the manifest that
    parses only the lines it keeps."""
    low: list[tuple[int, dict[str, Any]]] = []
    others: list[tuple[int, dict[str, Any]]] = []
    count = 0
    for at, (line, fields) in enumerate(manifest.pairs(out)):
        if '"status": "low_quality"' not in (line if fields is None else fields) and len(others) >= rows:
            count += any(k in line or k in (fields or "") for k in ('"status": ', '"quality": '))
            continue
        entry = json.loads(manifest.merged(line, fields))
        if entry.get("quality") or entry.get("status"):
            count += 1
            (low if entry.get("status") == "low_quality" else others).append((at, entry))
    return [entry for _at, entry in sorted(low + others, key=lambda found: found[0])], count


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


_ID = re.compile(r'^\{"video_id": "([^"\\\n]*)"', re.M)  # an entry line's id, as json.dumps writes it first
CHUNK_CHARS = 1 << 25


def chosen(out: Path, run_id: str, lines: Lines, rows: int = MAX_ROWS) -> tuple[list[dict[str, Any]], int] | None:
    """``recorded(out, rows)`` from what the end of ``run_id`` read of its outcomes lines (``lines``, with the
    fields of ``wanted(out, rows)``'s videos and of the low_quality ones): the manifest is read once, its
    lines' ids found in C, and a line is parsed only when the table shows it. None (the report then takes
    ``recorded``'s pass) when another run's outcomes are merged over the manifest, the manifest is of an
    earlier version's format, or the table shows a video of the run whose fields were not kept."""
    if lines.fields is None or [rid for rid, _p in manifest.outcome_runs(out)] != [run_id]:
        return None
    if manifest.head(out).get("order") != manifest.ORDER:
        return None
    table: list[dict[str, Any]] = []
    state = {"others": 0, "count": 0}
    try:
        with open(out / manifest.MANIFEST, encoding="utf-8") as fh:
            fh.readline()
            rest = ""
            while chunk := fh.read(CHUNK_CHARS):
                text, _, rest = (rest + chunk).rpartition("\n")
                _chunk(text + "\n", lines, table, state, rows)
            _chunk(rest, lines, table, state, rows)
    except (OSError, _Unknown):
        return None
    return table, state["count"]


def _chunk(text: str, lines: Lines, table: list[dict[str, Any]], state: dict[str, int], rows: int) -> None:
    """Add to ``table`` what ``recorded`` takes of the manifest lines in ``text`` (whole lines)."""
    status, fields = lines.status, lines.fields or {}
    ids = _ID.findall(text)
    closing = text.count("\n]}") + text.startswith("]}")
    if len(ids) != text.count("\n") - closing or any(vid not in status for vid in ids):
        for line in text.splitlines():  # entries of no video of the run (or lines of another shape): each looked at
            if line in ("", "]}"):
                continue
            line = line[:-1] if line.endswith(",") else line
            vid = manifest.video_id_of(line)
            if vid is None:
                vid = json.loads(line).get("video_id")
            _line(line, vid, lines, table, state, rows)
        return
    state["count"] += len(ids)  # every entry of a video of the run has a status
    others, shown = state["others"], []
    for k, vid in enumerate(ids):  # as ``recorded``: every low_quality video, the first ``rows`` others
        if others >= rows:
            shown += [j for j in range(k, len(ids)) if status[ids[j]] == "low_quality"]
            break
        shown.append(k)
        others += status[vid] != "low_quality"
    state["others"] = others
    at, line_at = 0, 0  # where the search goes on, and the index of the line starting there
    for k in shown:  # the shown entries' lines, in order, each found forward from the one before
        head = '{"video_id": "' + ids[k] + '"'
        start = text.find(head, at)
        while start >= 0 and line_at + text.count("\n", at, start) != k or start > 0 and text[start - 1] != "\n":
            start = text.find(head, start + 1)  # an id inside another line, or the same id on an earlier line
        if start < 0:
            raise _Unknown(ids[k])
        end = text.find("\n", start)
        line_at, at = k + 1, end + 1
        line = text[start:end]
        if ids[k] not in fields:
            raise _Unknown(ids[k])
        table.append(json.loads(manifest.merged(line[:-1] if line.endswith(",") else line, fields[ids[k]])))


def _line(
    line: str, vid: str | None, lines: Lines, table: list[dict[str, Any]], state: dict[str, int], rows: int
) -> None:
    """``recorded``'s step for one manifest line."""
    recorded_status = lines.status.get(vid) if vid is not None else None
    fields = None
    low = '"status": "low_quality"' in line if recorded_status is None else recorded_status == "low_quality"
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
        table.append(entry)
        state["others"] += entry.get("status") != "low_quality"


def section(out: Path, table: tuple[list[dict[str, Any]], int] | None = None) -> str:
    """The HTML of the quality table (empty when the manifest records no quality): at most MAX_ROWS
    videos (every low_quality one first), with the number left out. ``table``: the videos and count
    ``recorded`` gives, when the run's end has them already (``chosen``)."""
    videos, count = table if table is not None else recorded(out)
    if not videos:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for _s, _m, h, _f in COLUMNS)
    rows = []
    for v in videos:
        quality = v.get("quality") or {}
        missed = "; ".join(
            f"{s['stage']} {s['measure']} {s['value']} (quality.{s['setting']}: {s['threshold']})"
            for s in v.get("shortfalls", [])
        )
        image = preview(out, v["video_id"])
        picture = f'<img src="{image}" alt="preview of {html.escape(v["path"])}">' if image else "no intermediates"
        cells = "".join(f"<td>{_cell(quality, s, m, f)}</td>" for s, m, _h, f in COLUMNS)
        status = html.escape(v.get("status", "?"))
        css = ' class="low"' if v.get("status") == "low_quality" else ""
        rows.append(
            f"<tr{css}><td>{html.escape(v['path'])}<br>{picture}</td><td>{status}<br>{html.escape(missed)}</td>{cells}</tr>"
        )
    more = (
        f" {count - len(videos)} more videos are not shown here: OUT/manifest.json and OUT/runs/*.outcomes/ "
        "hold each one's status and quality."
        if count > len(videos)
        else ""
    )
    return (
        "<h2>Quality per video</h2>\n<p>Measured by each stage; thresholds are the settings' <code>quality:</code>. "
        f"A low_quality video is quarantined and left out of the statistics.{more}</p>\n"
        f'<table class="quality"><tr><th>video</th><th>status</th>{head}</tr>\n' + "\n".join(rows) + "\n</table>"
    )

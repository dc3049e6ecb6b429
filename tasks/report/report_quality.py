"""The report's per-video quality table: each video's status, quality, missed gates and preview."""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path
from typing import Any

from tasks.records import manifest
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

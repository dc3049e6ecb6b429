"""Text and noun per video from a ``metadata.csv`` (y2r's columns clip_id, noun, text).

y2r's writer reads this file when ``include_text`` is on (hgupt3/y2r
dataset_scripts/create_h5_dataset.py L1007-1029) and keys it by ``int(clip_id)``, the index of
the video in sorted order (its preprocess names frame folders ``{index:05d}``, preprocess.py
L63, L175). Here ``clip_id`` is the video's path relative to RAW_DIR without its extension
(``video_000`` for ``RAW_DIR/video_000.mp4``, ``kitchen/take_2`` for a subfolder); an integer that
names no such path is taken as y2r's index in the sorted list of every video under RAW_DIR.
The text goes to ``root/text``; the noun is the masks stage's prompt.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

from tasks.errors import FramefleetError
from tasks.job_check import CONTROL

COLUMNS = ("clip_id", "noun", "text")
DEFAULT_NAME = "metadata.csv"
log = logging.getLogger("framefleet.metadata")


class MetadataError(FramefleetError):
    """The metadata file cannot be used; the message names the file, the row or video, and the fix."""


@dataclass(frozen=True)
class ClipText:
    """One video's description: ``text`` for ``root/text``, ``noun`` for the masks stage's prompt."""

    text: str = ""
    noun: str = ""


def clip_id(relative: Path) -> str:
    """Return the clip id of a video path relative to RAW_DIR: the posix path without its extension."""
    return relative.with_suffix("").as_posix()


def _read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [c.strip() for c in reader.fieldnames or []]
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise MetadataError(
                    f"{path}: no column {', '.join(repr(c) for c in missing)} in the header {header}; "
                    f"the first line must name the columns {', '.join(COLUMNS)}"
                )
            reader.fieldnames = header
            return [{k: (row.get(k) or "").strip() for k in COLUMNS} for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MetadataError(f"{path}: cannot read it as a UTF-8 CSV file ({exc})") from exc


def _as_index(value: str) -> int | None:
    try:
        number = float(value)  # pandas writes 42 as "42" or, in a float column, "42.0"
    except ValueError:
        return None
    return int(number) if number.is_integer() and number >= 0 else None


def read_metadata(path: Path, raw_dir: Path, videos: list[Path]) -> dict[str, ClipText]:
    """Return ``{clip_id: ClipText}`` for ``videos`` (every video under ``raw_dir``, sorted) from ``path``.

    Raises MetadataError for a missing column, an unreadable file or two rows for one video; a
    row that names no video is logged and ignored (y2r ignores such rows too).
    """
    ids = [clip_id(v.relative_to(raw_dir)) for v in videos]
    known = set(ids)
    found: dict[str, ClipText] = {}
    row_of: dict[str, int] = {}
    unmatched: list[str] = []
    for line, row in enumerate(_read_rows(path), start=2):
        key: str | None = row["clip_id"]
        if key not in known:
            index = _as_index(row["clip_id"])
            key = ids[index] if index is not None and index < len(ids) else None
        if key is None:
            unmatched.append(row["clip_id"])
            continue
        if key in found:
            raise MetadataError(f"{path}: lines {row_of[key]} and {line} both describe {key!r}; keep one row per video")
        for column in ("text", "noun"):
            if CONTROL.search(row[column].replace("\t", " ")):
                raise MetadataError(
                    f"{path}: line {line} ({key!r}): its {column} {row[column]!r:.120} holds a control character "
                    "(a NUL, a newline, an escape); the HDF5 file cannot hold it as text: remove it from that row"
                )
        found[key], row_of[key] = ClipText(text=row["text"], noun=row["noun"]), line
    if unmatched:
        log.warning(
            "%s: %d rows name no video under %s (ignored), e.g. %s",
            path,
            len(unmatched),
            raw_dir,
            ", ".join(repr(u) for u in unmatched[:3]),
        )
    return found


def texts_for(
    raw_dir: Path,
    videos: list[Path],
    metadata: Path | None = None,
    require_text: bool = False,
    selected: list[Path] | None = None,
) -> dict[str, ClipText]:
    """Return each video's ClipText by clip id, from ``metadata`` or RAW_DIR/metadata.csv when it exists.

    ``videos`` is every video under RAW_DIR, sorted (y2r's numeric ids index it); ``selected``
    those of this run (default all). A selected video without a row (or with an empty text)
    gets empty text and a warning, or, with ``require_text``, a MetadataError listing such
    videos. Without a file, every text is empty (an error with ``require_text``).
    """
    selected = videos if selected is None else selected
    path = metadata if metadata is not None else raw_dir / DEFAULT_NAME
    if not path.is_file():
        if metadata is not None or require_text:
            raise MetadataError(
                f"no metadata file at {path}; write one with the columns {', '.join(COLUMNS)} "
                f"(clip_id = the video's path under {raw_dir} without its extension), or pass --metadata FILE"
            )
        return {}
    found = read_metadata(path, raw_dir, videos)
    lacking = [clip_id(v.relative_to(raw_dir)) for v in selected]
    lacking = [c for c in lacking if not found.get(c, ClipText()).text]
    if lacking and require_text:
        raise MetadataError(
            f"{path}: {len(lacking)} of {len(selected)} videos have no text, e.g. "
            f"{', '.join(repr(c) for c in lacking[:5])}; add a row (clip_id, noun, text) for each, "
            "or drop --require-text to write those files without root/text"
        )
    if lacking:
        log.warning(
            "%s: %d of %d videos have no text and get none in their HDF5 file, e.g. %s",
            path,
            len(lacking),
            len(selected),
            ", ".join(repr(c) for c in lacking[:5]),
        )
    return found

"""The stages' intermediate files under OUT/work/: their size, and dropping those of finished videos.

A video's intermediates are needed until its HDF5 file is complete; after that only its partial
statistics are, and those live in its completion marker under OUT/markers/. ``keep`` (the
default) leaves them, so an unfinished video resumes where it stopped; ``drop`` deletes them as
each video finishes.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from tasks.errors import PathOutsideRoot
from tasks.outputs.stage_io import marker_of, read_done, work_dir
from tasks.outputs.storage import inside, write_text_atomic
from tasks.stages import dataset_stage

log = logging.getLogger("framefleet.intermediates")
MODES = ("keep", "drop")
DEFAULT = "keep"


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def drop(out_root: Path, video_id: str) -> int:
    """Delete a video's intermediates if its HDF5 file is complete; return the bytes freed (0 if kept).

    A marker that earlier versions kept inside the work folder is moved to OUT/markers/ first,
    so the statistics and ``--continue`` still find it.
    """
    final = dataset_stage().name
    record = read_done(out_root, video_id, final, check_hash=False)
    if record is None:
        return 0
    folder = work_dir(out_root, video_id)
    legacy = folder / f"{final}.done.json"
    marker = marker_of(out_root, video_id, final)
    if legacy.exists() and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(marker, legacy.read_text())
    work = Path(out_root).resolve() / "work"
    if folder.parent != work or not inside(folder, work) or folder.is_symlink():
        # work_dir confines the id already; this is the last word before a recursive delete.
        raise PathOutsideRoot(f"intermediates of {video_id!r}: {folder} is not a folder strictly inside {work}; kept")
    freed = folder_bytes(folder)
    shutil.rmtree(folder, ignore_errors=True)
    return freed


def clean(out_root: Path) -> tuple[int, int, int]:
    """Drop the intermediates of every finished video of ``out_root``; return (videos, kept, bytes freed).

    ``kept`` counts the videos whose HDF5 file is missing or incomplete: their intermediates let
    ``--continue`` finish them without redoing earlier stages.
    """
    done = kept = freed = 0
    for folder in sorted((out_root / "work").glob("*")):
        if not folder.is_dir():
            continue
        size = drop(out_root, folder.name)
        if folder.exists():
            kept += 1
        else:
            done, freed = done + 1, freed + size
    return done, kept, freed


def summary_line(out_root: Path) -> str | None:
    """A line on the intermediates left in OUT/work/ and how to drop them; None when there are none."""
    size = folder_bytes(out_root / "work")
    if not size:
        return None
    return (
        f"intermediates: {human_bytes(size)} in {out_root / 'work'} (`framefleet clean {out_root}` "
        f"deletes those of finished videos; --intermediates drop does it as they finish)"
    )


def human_bytes(n: float) -> str:
    """``n`` bytes as B, KB, MB, GB or TB (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"

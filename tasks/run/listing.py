"""The videos of a folder as a stream, in the order of their sorted paths, without a list of them all.

The order is that of ``sorted(paths, key=Path.parts)`` (y2r's numeric clip ids index it, and the
manifest is kept in it): a walk that lists each folder, sorts its names and goes into a sub-folder
where its name falls gives exactly that order, since two paths are ordered by their first differing
part, which two names of one folder are. Memory is one folder's names at a time (the largest folder,
not the dataset); the first video comes after one listing per level, not after the whole walk.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from tasks.outputs import remote

log = logging.getLogger("framefleet.enqueue")

VIDEO_SUFFIXES = {".mp4", ".mov", ".mkv", ".webm", ".avi"}


class Found(NamedTuple):
    """A video: its path relative to the folder walked (posix), and its size in bytes."""

    path: str
    bytes: int


def walk_videos(raw_dir: Path) -> Iterator[Found]:
    """Yield the videos under ``raw_dir`` (any depth, case-insensitive suffix) in sorted-path order.

    Symbolic links to files count as the files they lead to when those lie inside ``raw_dir``, as a worker
    reads a video (tasks.outputs.storage.confine); a link leading out of it is skipped with a warning, since
    every worker would refuse it. Links to folders are not followed (as ``Path.rglob``). A folder that
    vanishes or cannot be read during the walk is skipped. An object-store root's folder is listed from its
    bucket, once (tasks.outputs.remote): its videos are fetched when read.
    """
    listed = remote.listing(raw_dir)
    if listed is None:
        yield from _walk(str(raw_dir), "", os.path.realpath(raw_dir))
        return
    for key, size in sorted(listed, key=lambda found: PurePosixPath(found[0]).parts):
        name = key.rpartition("/")[2]
        if (dot := name.rfind(".")) > 0 and name[dot:].lower() in VIDEO_SUFFIXES:
            yield Found(key, size)


def _inside(path: str, base: str) -> bool:
    """Whether ``path``, links resolved, lies strictly inside the resolved folder ``base``."""
    real = os.path.realpath(path)
    return real != base and os.path.commonpath([real, base]) == base


def _walk(folder: str, prefix: str, base: str) -> Iterator[Found]:
    try:
        with os.scandir(folder) as listing:
            entries = sorted((e.name, e) for e in listing)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for name, entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(entry.path, f"{prefix}{name}/", base)
            elif (dot := name.rfind(".")) > 0 and name[dot:].lower() in VIDEO_SUFFIXES and entry.is_file():
                if entry.is_symlink() and not _inside(entry.path, base):
                    log.warning(
                        "skipped %r: a link to %r, outside %s, which the workers refuse to read; copy the video "
                        "into the folder, or enqueue the folder it is in",
                        prefix + name,
                        os.path.realpath(entry.path),
                        base,
                    )
                    continue
                yield Found(prefix + name, entry.stat().st_size)
        except FileNotFoundError:  # removed while the folder was walked
            continue

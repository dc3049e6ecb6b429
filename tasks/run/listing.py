"""The videos of a folder as a stream, in the order of their sorted paths, without a list of them all.

The order is that of ``sorted(paths, key=Path.parts)`` (y2r's numeric clip ids index it, and the
manifest is kept in it): a walk that lists each folder, sorts its names and goes into a sub-folder
where its name falls gives exactly that order, since two paths are ordered by their first differing
part, which two names of one folder are. Memory is one folder's names at a time (the largest folder,
not the dataset); the first video comes after one listing per level, not after the whole walk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from tasks.outputs import remote

VIDEO_SUFFIXES = {".mp4", ".mov", ".mkv", ".webm", ".avi"}


class Found(NamedTuple):
    """A video: its path relative to the folder walked (posix), and its size in bytes."""

    path: str
    bytes: int


def walk_videos(raw_dir: Path) -> Iterator[Found]:
    """Yield the videos under ``raw_dir`` (any depth, case-insensitive suffix) in sorted-path order.

    Symbolic links to files count as the files they lead to; links to folders are not followed
    (as ``Path.rglob``). A folder that vanishes or cannot be read during the walk is skipped. An object-store
    root's folder is listed from its bucket, once (tasks.outputs.remote): its videos are fetched when read.
    """
    listed = remote.listing(raw_dir)
    if listed is None:
        yield from _walk(str(raw_dir), "")
        return
    for key, size in sorted(listed, key=lambda found: PurePosixPath(found[0]).parts):
        name = key.rpartition("/")[2]
        if (dot := name.rfind(".")) > 0 and name[dot:].lower() in VIDEO_SUFFIXES:
            yield Found(key, size)


def _walk(folder: str, prefix: str) -> Iterator[Found]:
    try:
        with os.scandir(folder) as listing:
            entries = sorted((e.name, e) for e in listing)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for name, entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(entry.path, f"{prefix}{name}/")
            elif (dot := name.rfind(".")) > 0 and name[dot:].lower() in VIDEO_SUFFIXES and entry.is_file():
                yield Found(prefix + name, entry.stat().st_size)
        except FileNotFoundError:  # removed while the folder was walked
            continue

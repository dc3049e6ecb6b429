"""A dataset run: find the videos, give them stable ids, write the manifest, build each video's chain."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import mmap
import os
import re
import stat
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from celery import chain

from tasks.celery_app import TASK_PREFIX, app
from tasks.errors import DatasetError
from tasks.job import Job
from tasks.outputs import remote
from tasks.records import manifest
from tasks.run.listing import VIDEO_SUFFIXES, Found, walk_videos


def find_videos(raw_dir: Path) -> list[Path]:
    """Return the videos under ``raw_dir`` (any depth, case-insensitive suffix), sorted by path parts.

    A list of them all: what needs one (y2r's numeric clip ids, tools). A run streams them
    (tasks.run.listing.walk_videos, ``first_video``).
    """
    found = [raw_dir / v.path for v in first_video(raw_dir)]
    return found


def first_video(raw_dir: Path) -> Iterator[Found]:
    """The stream of ``raw_dir``'s videos (tasks.run.listing), its first already found: raises DatasetError
    before anything is done when the folder is missing or holds no video."""
    if not raw_dir.is_dir():
        raise DatasetError(f"the input folder {raw_dir} does not exist or is not a folder")
    stream = walk_videos(raw_dir)
    first = next(stream, None)
    if first is None:
        raise DatasetError(f"no videos in {raw_dir} (looked for {', '.join(sorted(VIDEO_SUFFIXES))}, any case)")
    return itertools.chain([first], stream)


def video_id(relative: Path) -> str:
    """A stable id from the path relative to the dataset root: a readable stem and a short hash."""
    return video_id_of(relative.as_posix())


_NOT_ID = re.compile(r"[^A-Za-z0-9_-]+")


def video_id_of(path: str) -> str:
    """``video_id`` of a relative posix path given as a string (no Path made: a million of them)."""
    name = path.rsplit("/", 1)[-1]
    dot = name.rfind(".")
    stem = name[:dot] if 0 < dot < len(name) - 1 else name  # Path.stem's rule
    return f"{_NOT_ID.sub('_', stem).strip('_')[:48] or 'video'}-{hashlib.sha256(path.encode()).hexdigest()[:10]}"


def check_folders(raw_dir: Path, out_dir: Path, resume: bool, force: bool, add: bool = False) -> None:
    """Refuse an output folder inside the input, a file as the output folder, an earlier run's folder
    without a mode flag, or an earlier run's folder over another input folder without ``add``."""
    raw, out = raw_dir.resolve(), out_dir.resolve()
    if out.exists() and not out.is_dir():
        raise DatasetError(f"the output folder {out_dir} is a file; name a folder (it is made if missing)")
    inside_url = remote.shown(out).startswith(remote.shown(raw).rstrip("/") + "/")  # two prefixes of one bucket
    if out == raw or raw in out.parents or inside_url:
        raise DatasetError(
            f"the output folder {remote.shown(out_dir)} is inside the input folder {remote.shown(raw_dir)}; "
            "choose an output folder outside it, so outputs are never taken for inputs"
        )
    manifest = out / "manifest.json"
    if manifest.exists() and not (resume or force):
        raise DatasetError(
            f"{remote.shown(out_dir)} already holds a framefleet run. Pass --continue to finish it (complete "
            "outputs are kept) or --force to redo every video; nothing was changed or deleted"
        )
    known = dataset_roots(out_dir)
    if manifest.exists() and known and remote.shown(raw) not in known and not add:
        raise DatasetError(
            f"{remote.shown(out_dir)} holds a run over {known[0]}, not {remote.shown(raw)}: --continue and --force "
            f"finish or redo that dataset. Give {known[0]} as RAW_DIR, or pass --add as well to add the videos of "
            f"{remote.shown(raw)} "
            "to this output folder on purpose (the manifest then records each video's own folder)"
        )


def dataset_roots(out_dir: Path) -> list[str]:
    """The input folders of the runs in ``out_dir``'s manifest, the first run's first; [] without one."""
    top = manifest.head(out_dir)
    if "roots" in top:  # this version's manifest lists them in its head: one line read
        return list(top["roots"])
    roots = [top["dataset_root"]] if top.get("dataset_root") else []
    if not roots:
        return []
    others = {json.loads(line).get("root") for line in manifest.lines(out_dir)} - {None, *roots}
    return roots + sorted(others)


class ManifestRun:
    """This run's entries of OUT/manifest.json, written as the folder is walked (tasks.records.manifest):
    ``entry`` for each video in walk order, then ``commit`` (or ``abort``).

    ``texts`` maps clip ids to ``tasks.run.metadata.ClipText``; an entry carries its ``text`` and
    ``noun`` (empty when the video has none) to the job. ``made_with``: this run's set of
    backends and settings (tasks.records.lineage.current_set), added to the manifest's ``provenance``
    (replacing the earlier sets when the run redoes every video: ``redo``).
    """

    def __init__(
        self,
        raw_dir: Path,
        out_dir: Path,
        run_id: str,
        texts: dict[str, Any] | None = None,
        made_with: dict[str, Any] | None = None,
        redo: bool = False,
    ) -> None:
        from tasks.records import lineage

        earlier = manifest.head(out_dir)
        self.root = remote.shown(raw_dir.resolve())  # an object-store RAW's URL, never this host's copy
        self.first_root = earlier.get("dataset_root") or self.root
        roots = dataset_roots(out_dir) or [self.first_root]
        # The videos of the other folders added to this one (--add): a path of this folder may not be one of theirs.
        self.others: dict[str, str] = {}
        if any(root != self.root for root in roots):
            for line in manifest.lines(out_dir):
                e = json.loads(line)
                if e.get("root", self.first_root) != self.root:
                    self.others[e["video_id"]] = e.get("root", self.first_root)
        head = {"dataset_root": self.first_root, "last_run": run_id, "updated": time.time()}
        head["provenance"] = (
            lineage.with_set(earlier, made_with, redo) if made_with else earlier.get("provenance") or []
        )
        head["roots"] = roots + ([self.root] if self.root not in roots else [])
        self.texts = texts or {}
        self.writer = manifest.Writer(out_dir, head)

    def entry(self, found: Found) -> dict[str, Any]:
        """Add the video ``found`` (relative to this run's folder) to the manifest; return its entry.

        Raises DatasetError when a video of another folder of this output has the same path."""
        from tasks.run.metadata import ClipText

        described = self.texts.get(found.path.rsplit(".", 1)[0], ClipText()) if self.texts else ClipText()
        vid = video_id_of(found.path)
        entry = {
            "video_id": vid,
            "path": found.path,
            "bytes": found.bytes,
            "text": described.text,
            "noun": described.noun,
        }
        if self.root != self.first_root:  # added with --add: this video lives under another folder
            entry["root"] = self.root
        self.check(vid, found.path)
        self.writer.add(entry)
        return entry

    def check(self, vid: str, path: str) -> None:
        """Raise DatasetError when video ``vid`` (at ``path``) is a video of another folder of this output."""
        if vid in self.others:
            raise DatasetError(
                f"{path} of {self.root} has the same path as a video of {self.others[vid]} "
                "already in this output folder, so their outputs would overwrite each other; rename one "
                "(or move it into a subfolder) and enqueue again"
            )

    def commit(self) -> None:
        self.writer.commit()

    def abort(self) -> None:
        self.writer.abort()


def write_manifest(
    raw_dir: Path,
    out_dir: Path,
    videos: list[Path],
    run_id: str,
    texts: dict[str, Any] | None = None,
    made_with: dict[str, Any] | None = None,
    redo: bool = False,
) -> list[dict[str, Any]]:
    """Write OUT/manifest.json (earlier entries kept) for ``videos`` (sorted by path parts) and return
    this run's entries (see ManifestRun)."""
    run = ManifestRun(raw_dir, out_dir, run_id, texts, made_with, redo)
    try:
        entries = [run.entry(Found(v.relative_to(raw_dir).as_posix(), v.stat().st_size)) for v in videos]
    except BaseException:
        run.abort()
        raise
    run.commit()
    return entries


class Completed:
    """Whether a video's HDF5 output in OUT is complete, asked one video at a time (``done(video_id)``).

    A file whose size and modification time are those its marker recorded is taken as complete
    without reading it; one touched since (same size, other time) is hashed. (verify_dataset.py
    reads every file in full.) A video whose marker exists and whose file has the size and time of its
    entry in tasks.statistics.partials (its file and segments in OUT, and with ``r`` an earlier version's Redis
    copy) is complete without reading its marker. What is read once, when made: the markers' names and each entry's size
    and time (not its row: about 0.2 KB a video in memory, not the file's 0.4 KB and more).
    """

    def __init__(self, out_dir: Path, r: Any = None) -> None:
        from tasks.outputs.stage_io import marked_videos
        from tasks.statistics import partials

        self.root = out_dir.resolve()
        self.recorded = recorded_outputs(self.root)
        for vid, entry in partials.read(r, self.root).items():  # an earlier version's Redis copy, if it lives
            size, mtime_ns, _kind = partials.HEADER.unpack_from(entry)
            self.recorded[vid] = (size, mtime_ns)
        self.marked = marked_videos(self.root) if self.recorded else set()
        self.prefix = str(self.root) + os.sep  # strings, not Paths: a million of them

    def done(self, vid: str) -> bool:
        recorded = self.recorded.get(vid)
        if recorded is not None and vid in self.marked:
            try:
                st = os.lstat(self.prefix + vid + ".hdf5")  # a link in place of an output is not an output
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == recorded:
                return True
        from tasks.outputs.stage_io import read_done
        from tasks.outputs.storage import IF_TOUCHED
        from tasks.stages import dataset_stage

        return read_done(self.root, vid, dataset_stage().name, check_hash=IF_TOUCHED) is not None


def recorded_outputs(out_root: Path) -> dict[str, tuple[int, int]]:
    """(bytes, modification time in ns) of each video's dataset file as OUT/markers/partials.bin and the
    segments beside it recorded it (tasks.statistics.partials; the newer over the older), read through a memory
    map without copying the rows; {} without any, and of a damaged file only the entries before the damage."""
    from tasks.statistics import partials

    found: dict[str, tuple[int, int]] = {}
    for path in [partials.file_path(out_root), *(p for p, _size in partials.segments(out_root))]:
        _recorded_in(path, found)
    return found


def _recorded_in(path: Path, found: dict[str, tuple[int, int]]) -> None:
    from tasks.statistics import partials

    try:
        with open(path, "rb") as fh:
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # missing, or empty (ValueError: an empty file cannot be mapped)
        return
    record, header = partials.RECORD, partials.HEADER
    with data:
        if data[: len(partials.MAGIC)] != partials.MAGIC:
            return
        at, end = len(partials.MAGIC), len(data)
        try:
            while at + record.size <= end:
                size, name = record.unpack_from(data, at)
                at += record.size
                if at + size + name > end or size < header.size:
                    break
                found[data[at + size : at + size + name].decode()] = header.unpack_from(data, at)[:2]
                at += size + name
        except (struct.error, UnicodeDecodeError):
            pass  # what follows is damaged: those videos' markers are read


def incomplete(entries: list[dict[str, Any]], out_dir: Path, r: Any = None) -> list[dict[str, Any]]:
    """Return the entries whose HDF5 output is missing, of another size, or altered since its marker (Completed)."""
    check = Completed(out_dir, r)
    return [e for e in entries if not check.done(e["video_id"])]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def run_job(
    raw_dir: Path,
    out_dir: Path,
    run_id: str,
    gpus: list[int] | None = None,
    force: bool = False,
    intermediates: str = "keep",
) -> Job:
    """What every job of the run shares (its video fields empty): roots, modes, chain and settings hashes."""
    from tasks.celery_app import settings
    from worker_config.settings import stage_entry

    conf = settings()
    order = tuple(conf.enabled_stages())
    # Each stage runs only under the settings it was enqueued with (tasks.pipeline.same_settings).
    hashes = {name: stage_entry(conf, name)["sha256"] for name in order}
    return Job(
        run_id=run_id,
        video_id="",
        dataset_root=str(raw_dir.resolve()),
        output_root=str(out_dir.resolve()),
        gpus=None if gpus is None else tuple(gpus),
        force=force,
        intermediates=intermediates,
        chain=order,
        settings=hashes,
    )


def job_of(shared: Job, entry: dict[str, Any]) -> Job:
    """The job of the manifest entry ``entry`` in the run whose shared fields ``shared`` holds."""
    return dataclasses.replace(
        shared,
        video_id=entry["video_id"],
        video=entry["path"],
        text=entry.get("text", ""),
        noun=entry.get("noun", ""),
    )


def build_jobs(
    entries: list[dict[str, Any]],
    raw_dir: Path,
    out_dir: Path,
    run_id: str,
    gpus: list[int] | None = None,
    force: bool = False,
    already_complete: int = 0,
    intermediates: str = "keep",
) -> tuple[list[Job], dict[str, Any]]:
    """Return (each video's job for its first stage, the run's record for the statistics callback)."""
    shared = run_job(raw_dir, out_dir, run_id, gpus, force, intermediates)
    run: dict[str, Any] = {
        "run_id": run_id,
        "output_root": shared.output_root,
        "started": time.time(),
        "videos": len(entries),
        "already_complete": already_complete,
    }
    return [job_of(shared, entry) for entry in entries], run


def video_chain(job: Job) -> Any:
    """The Celery chain of one video: a task per stage of its chain, each passing the job message on."""
    # By name from Celery's registry (tasks/__init__ registers the stage tasks), not by import:
    # the run sits below the stage task, whose last stage counts the video in its run.
    first, *rest = (app.tasks[TASK_PREFIX + name] for name in job.chain)
    return chain(first.s(job.to_dict()), *(t.s() for t in rest))

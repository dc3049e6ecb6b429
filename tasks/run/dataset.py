"""A dataset run: find the videos, give them stable ids, write the manifest, build each video's chain."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from celery import chain

from tasks.celery_app import TASK_PREFIX, app
from tasks.errors import DatasetError
from tasks.job import Job

VIDEO_SUFFIXES = {".mp4", ".mov", ".mkv", ".webm", ".avi"}


def find_videos(raw_dir: Path) -> list[Path]:
    """Return the videos under ``raw_dir`` (any depth, case-insensitive suffix), sorted by path."""
    if not raw_dir.is_dir():
        raise DatasetError(f"the input folder {raw_dir} does not exist or is not a folder")
    # Sorted by parts, the order of Path's own comparison (y2r's numeric clip ids follow it), ten
    # times faster for 50,000 paths than comparing Path objects.
    found = sorted((p for p in raw_dir.rglob("*") if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES), key=_parts)
    if not found:
        raise DatasetError(f"no videos in {raw_dir} (looked for {', '.join(sorted(VIDEO_SUFFIXES))}, any case)")
    return found


def _parts(path: Path) -> tuple[str, ...]:
    return path.parts


def video_id(relative: Path) -> str:
    """A stable id from the path relative to the dataset root: a readable stem and a short hash."""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", relative.stem).strip("_")[:48] or "video"
    digest = hashlib.sha256(relative.as_posix().encode()).hexdigest()[:10]
    return f"{stem}-{digest}"


def check_folders(raw_dir: Path, out_dir: Path, resume: bool, force: bool, add: bool = False) -> None:
    """Refuse an output folder inside the input, a file as the output folder, an earlier run's folder
    without a mode flag, or an earlier run's folder over another input folder without ``add``."""
    raw, out = raw_dir.resolve(), out_dir.resolve()
    if out.exists() and not out.is_dir():
        raise DatasetError(f"the output folder {out_dir} is a file; name a folder (it is made if missing)")
    if out == raw or raw in out.parents:
        raise DatasetError(
            f"the output folder {out_dir} is inside the input folder {raw_dir}; "
            "choose an output folder outside it, so outputs are never taken for inputs"
        )
    manifest = out / "manifest.json"
    if manifest.exists() and not (resume or force):
        raise DatasetError(
            f"{out_dir} already holds a framefleet run. Pass --continue to finish it (complete "
            "outputs are kept) or --force to redo every video; nothing was changed or deleted"
        )
    known = dataset_roots(out_dir)
    if manifest.exists() and known and str(raw) not in known and not add:
        raise DatasetError(
            f"{out_dir} holds a run over {known[0]}, not {raw}: --continue and --force finish or redo "
            f"that dataset. Give {known[0]} as RAW_DIR, or pass --add as well to add the videos of {raw} "
            "to this output folder on purpose (the manifest then records each video's own folder)"
        )


def dataset_roots(out_dir: Path) -> list[str]:
    """The input folders of the runs in ``out_dir``'s manifest, the first run's first; [] without one."""
    try:
        manifest = json.loads((out_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return []
    roots = [manifest["dataset_root"]] if manifest.get("dataset_root") else []
    roots += sorted({v["root"] for v in manifest.get("videos", []) if v.get("root")} - set(roots))
    return roots


def write_manifest(
    raw_dir: Path,
    out_dir: Path,
    videos: list[Path],
    run_id: str,
    texts: dict[str, Any] | None = None,
    made_with: dict[str, Any] | None = None,
    redo: bool = False,
) -> list[dict[str, Any]]:
    """Write OUT/manifest.json (earlier entries kept) and return this run's entries.

    ``texts`` maps clip ids to ``tasks.run.metadata.ClipText``; an entry carries its ``text`` and
    ``noun`` (empty when the video has none) to the job. ``made_with``: this run's set of
    backends and settings (tasks.run.lineage.current_set), added to the manifest's ``provenance``
    (replacing the earlier sets when the run redoes every video: ``redo``).
    """
    from tasks.run import lineage
    from tasks.run.metadata import ClipText, clip_id

    path = out_dir / "manifest.json"
    known: dict[str, Any] = {}
    root = str(raw_dir.resolve())
    first_root = root
    earlier: dict[str, Any] = {}
    if path.exists():
        earlier = json.loads(path.read_text())
        known = {v["video_id"]: v for v in earlier["videos"]}
        first_root = earlier.get("dataset_root") or root
    entries = []
    for video in videos:
        rel = video.relative_to(raw_dir)
        described = (texts or {}).get(clip_id(rel), ClipText())
        entry = {
            "video_id": video_id(rel),
            "path": rel.as_posix(),
            "bytes": video.stat().st_size,
            "text": described.text,
            "noun": described.noun,
        }
        if root != first_root:  # added with --add: this video lives under another folder
            entry["root"] = root
        if entry["video_id"] in known and known[entry["video_id"]].get("root", first_root) != root:
            raise DatasetError(
                f"{rel} of {root} has the same path as a video of {known[entry['video_id']].get('root', first_root)} "
                "already in this output folder, so their outputs would overwrite each other; rename one "
                "(or move it into a subfolder) and enqueue again"
            )
        # What a finished run recorded of the video (status, provenance, quality) stays until it is redone.
        known[entry["video_id"]] = {**known.get(entry["video_id"], {}), **entry}
        entries.append(entry)
    head = {"dataset_root": first_root, "last_run": run_id, "updated": time.time()}
    sets = earlier.get("provenance") or []
    head["provenance"] = lineage.with_set(earlier, made_with, redo) if made_with else sets
    ordered = sorted(known.values(), key=lambda v: (v.get("root", ""), v["path"]))
    lineage.write(out_dir, head, ordered)
    return entries


def incomplete(entries: list[dict[str, Any]], out_dir: Path, r: Any = None) -> list[dict[str, Any]]:
    """Return the entries whose HDF5 output is missing, of another size, or altered since its marker.

    A file whose size and modification time are those its marker recorded is taken as complete
    without reading it; one touched since (same size, other time) is hashed. (verify_dataset.py
    reads every file in full.) A video whose marker exists and whose file has the size and time of its
    entry in tasks.run.partials (its file in OUT, and with ``r`` Redis's copy of a live run) is complete
    without reading its marker.
    """
    import os

    from tasks.outputs.stage_io import marked_videos, read_done
    from tasks.outputs.storage import IF_TOUCHED
    from tasks.run import partials
    from tasks.stages import dataset_stage

    final, root = dataset_stage().name, out_dir.resolve()
    kept = partials.known(r, root)
    marked = marked_videos(root) if kept else set()
    prefix = str(root) + os.sep  # strings, not Paths: 50,000 of them
    todo = []
    for e in entries:
        vid = e["video_id"]
        entry = kept.get(vid)
        if entry is not None and vid in marked and partials.unchanged(entry, prefix + vid + ".hdf5"):
            continue
        if read_done(root, vid, final, check_hash=IF_TOUCHED) is None:
            todo.append(e)
    return todo


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


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
    from tasks.celery_app import settings
    from worker_config.settings import stage_entry

    run: dict[str, Any] = {
        "run_id": run_id,
        "output_root": str(out_dir.resolve()),
        "started": time.time(),
        "videos": len(entries),
        "already_complete": already_complete,
    }
    conf = settings()
    order = tuple(conf.enabled_stages())
    # Each stage runs only under the settings it was enqueued with (tasks.pipeline.same_settings).
    hashes = {name: stage_entry(conf, name)["sha256"] for name in order}
    dataset_root = str(raw_dir.resolve())
    jobs = [
        Job(
            run_id=run_id,
            video_id=entry["video_id"],
            video=entry["path"],
            dataset_root=dataset_root,
            output_root=run["output_root"],
            gpus=None if gpus is None else tuple(gpus),
            gpu=None,
            force=force,
            intermediates=intermediates,
            text=entry.get("text", ""),
            noun=entry.get("noun", ""),
            chain=order,
            settings=hashes,
        )
        for entry in entries
    ]
    return jobs, run


def video_chain(job: Job) -> Any:
    """The Celery chain of one video: a task per stage of its chain, each passing the job message on."""
    # By name from Celery's registry (tasks/__init__ registers the stage tasks), not by import:
    # the run sits below the stage task, whose last stage counts the video in its run.
    first, *rest = (app.tasks[TASK_PREFIX + name] for name in job.chain)
    return chain(first.s(job.to_dict()), *(t.s() for t in rest))

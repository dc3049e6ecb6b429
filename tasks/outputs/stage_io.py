"""Where each stage's output lives and how its inputs are gathered from earlier outputs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from tasks.errors import PathOutsideRoot
from tasks.job import Job
from tasks.outputs import provenance
from tasks.outputs.storage import confine, load_npz, read_marker
from tasks.stages import dataset_stage, stage_class
from worker_config.settings import Settings

MARKERS_DIR = "markers"
UPSTREAM_KEY = "upstream_provenance"
MARKER_SUFFIX = ".hdf5.done.json"  # a dataset file's marker: OUT/markers/<shard>/<video>.hdf5.done.json


def check_roots(job: Job, conf: Settings) -> None:
    """Refuse a job whose roots lie outside the roots this worker's settings allow (when set)."""
    for key, given, allowed in (
        ("dataset_root", job.dataset_root, conf.dataset_root),
        ("output_root", job.output_root, conf.output_root),
    ):
        if allowed is None:
            continue
        root, base = Path(given).resolve(), Path(allowed).resolve()
        if root != base and base not in root.parents:
            raise PathOutsideRoot(
                f"{key} {root} is outside {base}, the {key} this worker serves; refused "
                f"(set {key} in the worker's settings to change it)"
            )


def own_file(out_root: Path, folder: str | Path, name: str) -> Path:
    """``OUT/<folder>/<name>`` resolved, asserted to be a name of its own strictly inside that folder (a video
    id such as ``..``, ``.`` or ``a/b`` would name the folder itself, its parent or another's); raises
    PathOutsideRoot."""
    path = confine(out_root, Path(folder) / name)
    parent = Path(out_root, folder).resolve()
    if path.parent != parent:
        raise PathOutsideRoot(f"{name!r} is not a name of its own in {parent}; refused without writing it")
    return path


def work_dir(out_root: Path, video_id: str) -> Path:
    return own_file(out_root, "work", video_id)


def output_path(out_root: Path, video_id: str, stage: str) -> Path:
    """The final output of ``stage`` for a video: an npz intermediate, or the dataset's .hdf5."""
    if stage_class(stage).writes == "hdf5":
        return own_file(out_root, "", f"{video_id}.hdf5")
    return work_dir(out_root, video_id) / f"{stage}.npz"


def dataset_file(out_root: Path, video_id: str) -> tuple[Path, Path]:
    """A video's dataset file and its completion marker."""
    final = dataset_stage().name
    return output_path(out_root, video_id, final), marker_of(out_root, video_id, final)


def marker_shard(video_id: str) -> str:
    """The sub-folder of OUT/markers/ that holds a video's dataset marker: one of 256, so that no folder
    holds a million files."""
    return hashlib.sha256(video_id.encode()).hexdigest()[:2]


def marker_of(out_root: Path, video_id: str, stage: str) -> Path:
    """The completion marker: beside npz files; for the .hdf5 in OUT/markers/<shard>/, since it holds the
    video's partial statistics and must outlive OUT/work/ (``--intermediates drop``)."""
    if stage_class(stage).writes == "hdf5":
        return own_file(out_root, Path(MARKERS_DIR) / marker_shard(video_id), f"{video_id}{MARKER_SUFFIX}")
    return work_dir(out_root, video_id) / f"{stage}.done.json"


def read_done(out_root: Path, video_id: str, stage: str, check_hash: bool | str = True) -> dict[str, Any] | None:
    """The marker of a complete ``stage`` output of a video, or None; reads the .hdf5 marker where
    earlier versions wrote it (OUT/markers/ itself, OUT/work/<video>/) too."""
    output = output_path(out_root, video_id, stage)
    found = read_marker(output, marker_of(out_root, video_id, stage), check_hash=check_hash)
    if found is None and stage_class(stage).writes == "hdf5":
        for legacy in (
            confine(out_root, Path(MARKERS_DIR) / f"{video_id}{MARKER_SUFFIX}"),
            work_dir(out_root, video_id) / f"{stage}.done.json",
        ):
            found = read_marker(output, legacy, check_hash=check_hash)
            if found is not None:
                break
    return found


def marked_videos(out_root: Path) -> set[str]:
    """The ids of the videos with a dataset marker under OUT/markers/ (in its shards, or directly in it
    as earlier versions wrote them): one listing per shard, never one of a million names."""
    root = out_root / MARKERS_DIR
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return set()
    found = set()
    for entry in entries:
        if entry.name.endswith(MARKER_SUFFIX):
            found.add(entry.name.removesuffix(MARKER_SUFFIX))
        elif len(entry.name) == 2 and entry.is_dir(follow_symlinks=False):
            found.update(n.removesuffix(MARKER_SUFFIX) for n in os.listdir(entry.path) if n.endswith(MARKER_SUFFIX))
    return found


def gather_inputs(stage: str, job: Job, enabled: tuple[str, ...]) -> dict[str, Any]:
    """Return the inputs of ``stage`` for ``job``: the outputs of the stages it reads (and of the
    ``enabled`` optional stages it uses), chosen by the stage class."""
    cls = stage_class(stage)
    out_root = Path(job.output_root)
    names = [*cls.reads, *(u for u in cls.uses if u in enabled)]
    outputs = {name: load_npz(output_path(out_root, job.video_id, name)) for name in names}
    inputs = cls.select_inputs(outputs, job)
    # What made those outputs (tasks.outputs.provenance), for this stage's own record; none from earlier versions.
    inputs[UPSTREAM_KEY] = provenance.merge(
        [provenance.decode(o[provenance.META_KEY]) for o in outputs.values() if provenance.META_KEY in o]
    )
    return inputs

"""Where each stage's output lives and how its inputs are gathered from earlier outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.errors import PathOutsideRoot
from tasks.storage import confine, load_npz
from worker_config.settings import Settings

NPZ_STAGES = ("preprocess", "depth", "tracks", "hands")


def check_roots(job: dict[str, Any], conf: Settings) -> None:
    """Refuse a job whose roots lie outside the roots this worker's settings allow (when set)."""
    for key, allowed in (("dataset_root", conf.dataset_root), ("output_root", conf.output_root)):
        if allowed is None:
            continue
        root, base = Path(job[key]).resolve(), Path(allowed).resolve()
        if root != base and base not in root.parents:
            raise PathOutsideRoot(f"{key} {root} is outside {base}, the {key} this worker serves; refused "
                                  f"(set {key} in the worker's settings to change it)")


def work_dir(out_root: Path, video_id: str) -> Path:
    return confine(out_root, Path("work") / video_id)


def output_path(out_root: Path, video_id: str, stage: str) -> Path:
    """The final output of ``stage`` for a video: npz intermediates, the dataset's .hdf5."""
    if stage == "h5":
        return confine(out_root, f"{video_id}.hdf5")
    return work_dir(out_root, video_id) / f"{stage}.npz"


def marker_of(out_root: Path, video_id: str, stage: str) -> Path:
    """The completion marker: beside npz files, in the work folder for the .hdf5."""
    return work_dir(out_root, video_id) / f"{stage}.done.json"


def gather_inputs(stage: str, job: dict[str, Any]) -> dict[str, Any]:
    """Return the inputs of ``stage`` for ``job``, read from earlier stages' outputs."""
    out_root = Path(job["output_root"])
    vid = job["video_id"]

    def load(name: str) -> dict[str, Any]:
        return load_npz(output_path(out_root, vid, name))

    if stage == "preprocess":
        return {"video_path": str(confine(Path(job["dataset_root"]), job["video"]))}
    pre = load("preprocess")
    if stage == "depth":
        return {"frames": pre["frames"]}
    depth = load("depth")
    if stage == "tracks":
        return {"frames": pre["frames"], **depth}
    if stage == "hands":
        return {"frames": pre["frames"], "intrinsics": depth["intrinsics"][0], "fps": float(pre["fps"]),
                "depths": depth["depths"]}
    if stage == "h5":
        return {
            "frames": pre["frames"],
            "depths": depth["depths"],
            "tracks": load("tracks"),
            "hands": load("hands"),
            "text": job.get("text", ""),
        }
    raise KeyError(f"unknown stage {stage!r}")

"""Depth (ViPE's role): metric depth, intrinsics and world->camera extrinsics per frame."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from tasks.errors import BadInput
from tasks.job import Job
from tasks.stages.base import Gate, ModelStage, Outputs, Progress, report, require


class DepthStage(ModelStage):
    """Turn ``{"frames"}`` into ``{"depths" (T, H, W) float16, "intrinsics" (T, 3, 3), "extrinsics" (T, 4, 4)}``
    and its ``quality``: the % of frames whose depth is flat (std < ``flat_std_threshold`` m), whether
    the camera was solved or fell back, the reprojection error where known (tasks.pipeline.quality gates it).
    """

    name = "depth"
    cpu_backend = "classical"
    gates = (
        Gate("flat_frame_pct", "max_flat_frame_pct", "max"),  # y2r's rule
        Gate("camera", "allow_camera_fallback", "allow", bad="fallback"),
        Gate("reprojection_error_px", "max_reprojection_error_px", "max"),
    )
    reads = ("preprocess",)

    def __init__(
        self,
        backend: str | None = None,
        flat_std_threshold: float = 0.1,
        max_flat_frame_pct: float | None = None,
        **backend_params: Any,
    ) -> None:
        if max_flat_frame_pct is not None:
            raise ValueError(
                f"stages.depth.params.max_flat_frame_pct ({max_flat_frame_pct}) is now a quality gate: "
                f"set quality.max_flat_frame_pct: {max_flat_frame_pct} in the settings instead"
            )
        self.flat_std_threshold = float(flat_std_threshold)
        super().__init__(backend, **backend_params)

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        return {"frames": outputs["preprocess"]["frames"]}

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        frames = require(inputs, "frames", self.name, (None, None, None, 3), "u")
        T, H, W = frames.shape[:3]
        if T == 0:
            raise BadInput("depth: the video has no frames; preprocess produced an empty clip")
        out = self.model.infer(frames, progress=lambda done, total: report(progress, done, total))
        depths = np.asarray(out["depths"], dtype=np.float32)
        if depths.shape != (T, H, W):
            raise RuntimeError(
                f"depth backend {self.backend_name!r} returned depths {depths.shape}, wanted {(T, H, W)}"
            )
        fx, fy, cx, cy = np.asarray(out["intrinsics"], dtype=np.float64).reshape(4)
        K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
        # ViPE writes camera->world; the contract stores world->camera.
        extrinsics = np.linalg.inv(np.asarray(out["cam_to_world"], dtype=np.float64))
        result = {
            "depths": depths.astype(np.float16),
            "intrinsics": np.tile(K, (T, 1, 1)).astype(np.float32),
            "extrinsics": extrinsics.astype(np.float32),
        }
        notes = dict(out.get("notes") or {})
        if notes:
            result["notes"] = notes
        result["quality"] = self.quality(depths, notes)
        return result

    def quality(self, depths: np.ndarray, notes: dict[str, Any]) -> dict[str, Any]:
        """What the depth's quality measures: flat frames (%), camera solved or fallback, reprojection error (px)."""
        finite = np.where(np.isfinite(depths), depths, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN frame counts as flat
            std = np.nanstd(finite.reshape(len(depths), -1), axis=1)
        flat = ~(std >= self.flat_std_threshold)
        measured: dict[str, Any] = {
            "flat_frame_pct": round(100.0 * float(flat.sum()) / len(depths), 3),
            "flat_frames": int(flat.sum()),
            "frames": len(depths),
            "flat_std_threshold_m": self.flat_std_threshold,
            "camera": "fallback" if notes.get("camera") == "fallback" else "solved",
        }
        if "median_reprojection_error_px" in notes:
            measured["reprojection_error_px"] = float(notes["median_reprojection_error_px"])
        return measured

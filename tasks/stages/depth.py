"""Depth (ViPE's role): metric depth, intrinsics and world->camera extrinsics per frame."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from tasks.errors import BadInput
from tasks.job import Job
from tasks.stages.base import ModelStage, Outputs, Progress, report, require


class DepthStage(ModelStage):
    """Turn ``{"frames"}`` into ``{"depths" (T, H, W) float16, "intrinsics" (T, 3, 3), "extrinsics" (T, 4, 4)}``.

    Raises BadInput when the depth is flat (per-frame std < ``flat_std_threshold`` m) on more
    than ``max_flat_frame_pct`` % of the frames.
    """

    name = "depth"
    reads = ("preprocess",)

    def __init__(
        self,
        backend: str | None = None,
        flat_std_threshold: float = 0.1,
        max_flat_frame_pct: float = 10.0,
        **backend_params: Any,
    ) -> None:
        self.flat_std_threshold = float(flat_std_threshold)
        self.max_flat_frame_pct = float(max_flat_frame_pct)
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
        self._check_not_flat(depths)
        fx, fy, cx, cy = np.asarray(out["intrinsics"], dtype=np.float64).reshape(4)
        K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
        # ViPE writes camera->world; the contract stores world->camera.
        extrinsics = np.linalg.inv(np.asarray(out["cam_to_world"], dtype=np.float64))
        result = {
            "depths": depths.astype(np.float16),
            "intrinsics": np.tile(K, (T, 1, 1)).astype(np.float32),
            "extrinsics": extrinsics.astype(np.float32),
        }
        if out.get("notes"):
            result["notes"] = dict(out["notes"])
        return result

    def _check_not_flat(self, depths: np.ndarray) -> None:
        finite = np.where(np.isfinite(depths), depths, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN frame; handled below
            std = np.nanstd(finite.reshape(len(depths), -1), axis=1)
        flat = ~(std >= self.flat_std_threshold)  # an all-NaN frame counts as flat
        pct = 100.0 * flat.sum() / len(depths)
        if pct > self.max_flat_frame_pct:
            raise BadInput(
                f"depth: the depth is flat (per-frame std < {self.flat_std_threshold} m) on "
                f"{int(flat.sum())} of {len(depths)} frames ({pct:.1f}% > {self.max_flat_frame_pct}%); "
                "the video shows no usable scene depth"
            )

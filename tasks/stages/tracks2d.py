"""2D tracks (CoTracker's role, for ``track_type: 2d``): pixel tracks per sliding window."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tasks.backends.convert_tracks import erode, grid_on_mask
from tasks.job import Job
from tasks.outputs.geometry import content_seed, window_starts
from tasks.stages.base import Gate, ModelStage, Outputs, Progress, report, require
from tasks.stages.masks import found_masks
from tasks.stages.tracks import DEFAULT_WINDOW_LENGTH, sample_pixels, track_quality


class Tracks2DStage(ModelStage):
    """Turn ``{"frames", "depths"[, "masks"]}`` into fixed-shape window arrays of pixel tracks.

    Outputs: ``window_starts`` (W,) int64, ``tracks`` (W, L, P, 2) float32 pixels (u, v) at frame
    size, zero-padded past ``num_points`` (W,) int64, ``visible`` (W, L, P) bool, ``num_frames``,
    ``resolution`` (H, W) int64 and ``window_length``. Off unless ``stages.tracks2d.enabled``.
    """

    name = "tracks2d"
    cpu_backend = "opencv"
    gates = (
        Gate("visible_fraction", "min_track_visible_fraction", "min"),
        Gate("windows_with_points", "min_track_windows", "min"),
    )
    reads = ("preprocess", "depth")
    uses = ("masks",)
    optional = True

    @classmethod
    def min_frames(cls, params: Mapping[str, Any]) -> int:
        return int(params.get("window_length", DEFAULT_WINDOW_LENGTH))

    def __init__(
        self,
        backend: str | None = None,
        window_length: int = DEFAULT_WINDOW_LENGTH,
        stride: int = 1,
        target_points: int = 64,
        mask_erosion_pixels: int = 0,
        grid_size: int = 0,
        **backend_params: Any,
    ) -> None:
        if window_length < 1 or stride < 1 or target_points < 0 or mask_erosion_pixels < 0:
            raise ValueError(
                "window_length and stride must be >= 1, target_points and mask_erosion_pixels >= 0, got "
                f"{window_length}, {stride}, {target_points}, {mask_erosion_pixels}"
            )
        self.window_length, self.stride, self.target_points = int(window_length), int(stride), int(target_points)
        self.mask_erosion_pixels = int(mask_erosion_pixels)
        # grid_size > 0: CoTracker's grid of grid_size x grid_size on the eroded mask, as y2r queries
        # it (process_cotracker.py, grid_size 64); 0: target_points pixels drawn at random.
        self.grid_size = int(grid_size)
        super().__init__(backend, **backend_params)

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        inputs = {"frames": outputs["preprocess"]["frames"], "depths": outputs["depth"]["depths"]}
        masks = found_masks(outputs)
        if masks is not None:
            inputs["masks"] = masks
        return inputs

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        frames = require(inputs, "frames", self.name, (None, None, None, 3), "u")
        T, H, W = frames.shape[:3]
        depths = require(inputs, "depths", self.name, (T, H, W), "f")
        masks = inputs.get("masks")
        L, P = self.window_length, self.target_points
        starts = window_starts(T, L, self.stride)
        P = max(P, self.grid_size**2)
        tracks = np.zeros((len(starts), L, P, 2), dtype=np.float32)
        visible = np.zeros((len(starts), L, P), dtype=bool)
        num_points = np.zeros(len(starts), dtype=np.int64)
        video_seed = content_seed(frames[:, ::8, ::8]) if len(starts) else 0
        for w, s in enumerate(starts):
            window = slice(int(s), int(s) + L)
            mask = None if masks is None else np.asarray(masks[s], dtype=bool)
            if self.grid_size > 0:
                on = np.ones(frames.shape[1:3], dtype=bool) if mask is None else erode(mask, self.mask_erosion_pixels)
                pixels = grid_on_mask(on, self.grid_size)
            else:
                pixels = sample_pixels(
                    depths[s], P, content_seed(np.int64(s), video_seed), mask, self.mask_erosion_pixels
                )
            if len(pixels):
                out = self.model.track2d(
                    frames[window], pixels, None if masks is None else np.asarray(masks[window], dtype=bool)
                )
                tracks[w, :, : len(pixels)] = np.asarray(out["tracks"], dtype=np.float32)
                visible[w, :, : len(pixels)] = np.asarray(out["visible"], dtype=bool)
            num_points[w] = len(pixels)
            if w % 8 == 7:
                report(progress, int(s) + 1, T)
        report(progress, T, T)
        return {
            "window_starts": starts,
            "tracks": tracks,
            "visible": visible,
            "num_points": num_points,
            "num_frames": np.int64(T),
            "resolution": np.array([H, W], dtype=np.int64),
            "window_length": np.int64(L),
            "quality": track_quality(visible & np.isfinite(tracks).all(axis=-1), num_points),
        }

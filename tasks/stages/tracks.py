"""Tracks (TAPIP3D's role): 3D point tracks per sliding window, in the window's first camera."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.geometry import content_seed, unproject, window_poses, window_starts
from tasks.stages import ModelStage, Progress, report, require


def sample_queries(depth: np.ndarray, K: np.ndarray, target_points: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return up to ``target_points`` points (N, 3) float64 unprojected from pixels with depth > 0, and those (N, 2).

    The pixels are drawn without replacement by a generator seeded with ``seed``, then
    sorted row-major, so the same frame and seed give the same points.
    """
    d = np.asarray(depth, dtype=np.float32)
    candidates = np.flatnonzero(np.isfinite(d) & (d > 0))
    n = min(target_points, candidates.size)
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(candidates, size=n, replace=False)) if n else candidates[:0]
    rows, cols = np.divmod(chosen, d.shape[1])
    pixels = np.stack([cols, rows], axis=-1).astype(np.float64)
    return unproject(pixels, d.reshape(-1)[chosen], K), pixels


class TracksStage(ModelStage):
    """Turn ``{"frames", "depths", "intrinsics", "extrinsics"}`` into fixed-shape window arrays.

    Outputs: ``window_starts`` (W,) int64, ``tracks`` (W, L, P, 3) float32 zero-padded past
    ``num_points`` (W,) int64, ``window_poses`` (W, L, 4, 4) float32 = inv(E_s) @ E_t,
    ``intrinsics`` (3, 3) of frame 0, ``num_frames``, ``resolution`` (H, W) int64, and
    ``window_length``. A video shorter than the window gives W = 0, not an error.
    """

    name = "tracks"

    def __init__(
        self,
        backend: str = "synthetic",
        window_length: int = 10,
        stride: int = 1,
        target_points: int = 64,
        **backend_params: Any,
    ) -> None:
        if window_length < 1 or stride < 1 or target_points < 0:
            raise ValueError(
                f"window_length and stride must be >= 1 and target_points >= 0, "
                f"got {window_length}, {stride}, {target_points}"
            )
        self.window_length = int(window_length)
        self.stride = int(stride)
        self.target_points = int(target_points)
        super().__init__(backend, **backend_params)

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        frames = require(inputs, "frames", self.name, (None, None, None, 3), "u")
        T, H, W = frames.shape[:3]
        depths = require(inputs, "depths", self.name, (T, H, W), "f")
        intrinsics = require(inputs, "intrinsics", self.name, (T, 3, 3), "f")
        extrinsics = require(inputs, "extrinsics", self.name, (T, 4, 4), "f")
        L, P = self.window_length, self.target_points
        starts = window_starts(T, L, self.stride)
        tracks = np.zeros((len(starts), L, P, 3), dtype=np.float32)
        num_points = np.zeros(len(starts), dtype=np.int64)
        poses = np.zeros((len(starts), L, 4, 4), dtype=np.float32)
        video_seed = content_seed(frames[:, ::8, ::8]) if len(starts) else 0
        for w, s in enumerate(starts):
            window = slice(int(s), int(s) + L)
            queries, pixels = sample_queries(depths[s], intrinsics[s], P, seed=content_seed(np.int64(s), video_seed))
            if len(queries):
                out = self.model.track(
                    frames=frames[window],
                    queries=queries,
                    depths=depths[window],
                    intrinsics=intrinsics[window],
                    extrinsics=extrinsics[window],
                    query_pixels=pixels,
                )
                tracks[w, :, : len(queries)] = out
            num_points[w] = len(queries)
            poses[w] = window_poses(extrinsics[window])
            if w % 8 == 7:
                report(progress, int(s) + 1, T)
        report(progress, T, T)
        return {
            "window_starts": starts,
            "tracks": tracks,
            "num_points": num_points,
            "window_poses": poses,
            "intrinsics": np.asarray(intrinsics[0], dtype=np.float32),
            "num_frames": np.int64(T),
            "resolution": np.array([H, W], dtype=np.int64),
            "window_length": np.int64(L),
        }

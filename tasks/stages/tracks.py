"""Tracks (TAPIP3D's role): 3D point tracks per sliding window, in the window's first camera."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tasks.backends.convert_tracks import grid_on_mask
from tasks.job import Job
from tasks.outputs.geometry import WINDOW_POSE_ORDERS, content_seed, unproject, window_poses, window_starts
from tasks.stages.base import Gate, ModelStage, Outputs, Progress, report, require
from tasks.stages.masks import found_masks

DEFAULT_WINDOW_LENGTH = 10  # frames of a track window (y2r's common.window_length)


def sample_pixels(
    depth: np.ndarray, target_points: int, seed: int, mask: np.ndarray | None = None, erosion_px: int = 0
) -> np.ndarray:
    """Return up to ``target_points`` pixels (N, 2) float64 (u, v) with depth > 0, inside ``mask`` when given.

    The mask (H, W) bool is first eroded by ``erosion_px``. The pixels are drawn without
    replacement by a generator seeded with ``seed``, then sorted row-major, so the same
    frame and seed give the same points.
    """
    d = np.asarray(depth, dtype=np.float32)
    ok = np.isfinite(d) & (d > 0)
    if mask is not None:
        from tasks.stages.masks import erode

        ok &= erode(mask, erosion_px)
    candidates = np.flatnonzero(ok)
    n = min(target_points, candidates.size)
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(candidates, size=n, replace=False)) if n else candidates[:0]
    rows, cols = np.divmod(chosen, d.shape[1])
    return np.stack([cols, rows], axis=-1).astype(np.float64)


def sample_queries(
    depth: np.ndarray,
    K: np.ndarray,
    target_points: int,
    seed: int,
    mask: np.ndarray | None = None,
    erosion_px: int = 0,
) -> np.ndarray:
    """Return up to ``target_points`` points (N, 3) float64 unprojected from the pixels of ``sample_pixels``."""
    d = np.asarray(depth, dtype=np.float32)
    pixels = sample_pixels(d, target_points, seed, mask, erosion_px)
    cols, rows = pixels[:, 0].astype(np.int64), pixels[:, 1].astype(np.int64)
    return unproject(pixels, d[rows, cols], K)


def grid_queries(depth: np.ndarray, K: np.ndarray, grid_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return TAPIP3D's grid queries of one frame: pixels (N, 2) and camera-frame points (N, 3) float64.

    zbw001/TAPIP3D ``utils/inference_utils.py:12-42`` (``get_grid_queries``, which y2r calls when a
    video has no mask, process_tapip3d.py:476-482): CoTracker's ``grid_size`` x ``grid_size`` grid over
    the frame, the depth read at each point's rounded pixel, points without depth > 0 dropped, and
    the rest unprojected at their unrounded pixel.
    """
    d = np.asarray(depth, dtype=np.float32)
    pixels = grid_on_mask(np.ones(d.shape, dtype=bool), grid_size)
    rows = np.clip(np.round(pixels[:, 1]).astype(int), 0, d.shape[0] - 1)
    cols = np.clip(np.round(pixels[:, 0]).astype(int), 0, d.shape[1] - 1)
    z = d[rows, cols]
    keep = np.isfinite(z) & (z > 0)
    return pixels[keep], unproject(pixels[keep], z[keep], K)


class TracksStage(ModelStage):
    """Turn ``{"frames", "depths", "intrinsics", "extrinsics"}`` into fixed-shape window arrays.

    Outputs: ``window_starts`` (W,) int64, ``tracks`` (W, L, P, 3) float32 zero-padded past
    ``num_points`` (W,) int64, ``window_poses`` (W, L, 4, 4) float32 = inv(E_s) @ E_t,
    ``intrinsics`` (3, 3) of frame 0, ``num_frames``, ``resolution`` (H, W) int64, and
    ``window_length``; and its ``quality`` (``track_quality``). A video shorter than the window
    gives W = 0, not an error.

    Queries: ``target_points`` pixels with depth sampled at random inside the eroded mask; where
    there is no mask (no masks stage, or it found nothing) and ``grid_size`` > 0, TAPIP3D's
    ``grid_size`` grid instead, as y2r does (``grid_queries``); P is then the most queries of a window.

    ``window_pose_order`` "y2r" (the default) writes y2r's ``inv(E_s) @ E_t`` and gives the
    backend the video's extrinsics (TAPIP3D's adapter makes y2r's poses of them); "camera" writes
    ``E_t @ inv(E_s)``, the correct world->camera pose of step t with camera s as the world,
    and gives the backend those as its extrinsics (README, "Two geometry conventions").
    """

    name = "tracks"
    cpu_backend = "opencv"
    gates = (
        Gate("visible_fraction", "min_track_visible_fraction", "min"),
        Gate("median_track_length", "min_median_track_length", "min"),
        Gate("windows_with_points", "min_track_windows", "min"),
    )
    reads = ("preprocess", "depth")
    uses = ("masks",)

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
        window_pose_order: str = "y2r",
        **backend_params: Any,
    ) -> None:
        if window_pose_order not in WINDOW_POSE_ORDERS:
            raise ValueError(f"window_pose_order must be one of {WINDOW_POSE_ORDERS}, got {window_pose_order!r}")
        self.window_pose_order = window_pose_order
        if window_length < 1 or stride < 1 or target_points < 0 or mask_erosion_pixels < 0 or grid_size < 0:
            raise ValueError(
                f"window_length and stride must be >= 1, target_points, mask_erosion_pixels and grid_size >= 0, "
                f"got {window_length}, {stride}, {target_points}, {mask_erosion_pixels}, {grid_size}"
            )
        self.grid_size = int(grid_size)
        self.window_length = int(window_length)
        self.stride = int(stride)
        self.target_points = int(target_points)
        self.mask_erosion_pixels = int(mask_erosion_pixels)
        super().__init__(backend, **backend_params)

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        inputs = {"frames": outputs["preprocess"]["frames"], **outputs["depth"]}
        masks = found_masks(outputs)
        if masks is not None:
            inputs["masks"] = masks
        return inputs

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        frames = require(inputs, "frames", self.name, (None, None, None, 3), "u")
        T, H, W = frames.shape[:3]
        depths = require(inputs, "depths", self.name, (T, H, W), "f")
        intrinsics = require(inputs, "intrinsics", self.name, (T, 3, 3), "f")
        extrinsics = require(inputs, "extrinsics", self.name, (T, 4, 4), "f")
        masks = inputs.get("masks")
        L, P = self.window_length, self.target_points
        starts = window_starts(T, L, self.stride)
        video_seed = content_seed(frames[:, ::8, ::8]) if len(starts) else 0
        chosen = [self._queries(depths[s], intrinsics[s], masks, int(s), video_seed) for s in starts]
        P = max([P, *(len(q) for _, q in chosen)])
        tracks = np.zeros((len(starts), L, P, 3), dtype=np.float32)
        num_points = np.zeros(len(starts), dtype=np.int64)
        poses = np.zeros((len(starts), L, 4, 4), dtype=np.float32)
        for w, s in enumerate(starts):
            window = slice(int(s), int(s) + L)
            pixels, queries = chosen[w]
            poses[w] = window_poses(extrinsics[window], self.window_pose_order)
            if len(queries):
                out = self.model.track(
                    frames=frames[window],
                    queries=queries,
                    depths=depths[window],
                    intrinsics=intrinsics[window],
                    extrinsics=extrinsics[window] if self.window_pose_order == "y2r" else poses[w],
                    query_pixels=pixels,
                    masks=None if masks is None else np.asarray(masks[window], dtype=bool),
                )
                tracks[w, :, : len(queries)] = out
            num_points[w] = len(queries)
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
            "quality": track_quality(np.isfinite(tracks).all(axis=-1), num_points),
        }

    def _queries(
        self, depth: np.ndarray, K: np.ndarray, masks: np.ndarray | None, s: int, video_seed: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return one window's query pixels (N, 2) and camera-frame points (N, 3) at its first frame ``s``."""
        if masks is None and self.grid_size > 0:
            return grid_queries(depth, K, self.grid_size)
        mask = None if masks is None else np.asarray(masks[s], dtype=bool)
        seed = content_seed(np.int64(s), video_seed)
        pixels = sample_pixels(depth, self.target_points, seed, mask, self.mask_erosion_pixels)
        return pixels, sample_queries(depth, K, self.target_points, seed, mask, self.mask_erosion_pixels)


def track_quality(present: Any, num_points: np.ndarray) -> dict[str, Any]:
    """Measure tracks from ``present`` (W, L, P) bool, whether each point is tracked at each step, with
    ``num_points`` (W,) valid: the fraction of a window's query points still tracked at its last step,
    median and lowest over windows, and the median number of frames a point is followed from its query."""
    visible, lengths = [], []
    for w, n in enumerate(np.asarray(num_points).tolist()):
        if n == 0:
            continue
        finite = np.asarray(present[w, :, :n], dtype=bool)  # (L, n)
        visible.append(float(finite[-1].mean()))
        lengths.append(np.cumprod(finite, axis=0).sum(axis=0))  # a lost point stays lost
    out: dict[str, Any] = {"windows": int(len(num_points)), "windows_with_points": len(visible)}
    if visible:
        out.update(
            visible_fraction=round(float(np.median(visible)), 4),
            visible_fraction_min=round(float(np.min(visible)), 4),
            median_track_length=float(np.median(np.concatenate(lengths))),
        )
    return out

"""Tracks (TAPIP3D's role): 3D point tracks per sliding window, in the window's first camera."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.job import Job
from tasks.outputs.geometry import content_seed, unproject, window_poses, window_starts
from tasks.stages.base import Gate, ModelStage, Outputs, Progress, report, require


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


class TracksStage(ModelStage):
    """Turn ``{"frames", "depths", "intrinsics", "extrinsics"}`` into fixed-shape window arrays.

    Outputs: ``window_starts`` (W,) int64, ``tracks`` (W, L, P, 3) float32 zero-padded past
    ``num_points`` (W,) int64, ``window_poses`` (W, L, 4, 4) float32 = inv(E_s) @ E_t,
    ``intrinsics`` (3, 3) of frame 0, ``num_frames``, ``resolution`` (H, W) int64, and
    ``window_length``; and its ``quality`` (``track_quality``). A video shorter than the window
    gives W = 0, not an error.
    """

    name = "tracks"
    cpu_backend = "opencv"
    gates = (
        Gate("visible_fraction", "min_track_visible_fraction", "min"),
        Gate("median_track_length", "min_median_track_length", "min"),
    )
    reads = ("preprocess", "depth")
    uses = ("masks",)

    def __init__(
        self,
        backend: str | None = None,
        window_length: int = 10,
        stride: int = 1,
        target_points: int = 64,
        mask_erosion_pixels: int = 0,
        **backend_params: Any,
    ) -> None:
        if window_length < 1 or stride < 1 or target_points < 0 or mask_erosion_pixels < 0:
            raise ValueError(
                f"window_length and stride must be >= 1 and target_points >= 0, "
                f"got {window_length}, {stride}, {target_points}"
            )
        self.window_length = int(window_length)
        self.stride = int(stride)
        self.target_points = int(target_points)
        self.mask_erosion_pixels = int(mask_erosion_pixels)
        super().__init__(backend, **backend_params)

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        inputs = {"frames": outputs["preprocess"]["frames"], **outputs["depth"]}
        if "masks" in outputs:
            inputs["masks"] = outputs["masks"]["masks"]
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
        tracks = np.zeros((len(starts), L, P, 3), dtype=np.float32)
        num_points = np.zeros(len(starts), dtype=np.int64)
        poses = np.zeros((len(starts), L, 4, 4), dtype=np.float32)
        video_seed = content_seed(frames[:, ::8, ::8]) if len(starts) else 0
        for w, s in enumerate(starts):
            window = slice(int(s), int(s) + L)
            mask = None if masks is None else np.asarray(masks[s], dtype=bool)
            seed = content_seed(np.int64(s), video_seed)
            pixels = sample_pixels(depths[s], P, seed, mask, self.mask_erosion_pixels)
            queries = sample_queries(depths[s], intrinsics[s], P, seed, mask, self.mask_erosion_pixels)
            if len(queries):
                out = self.model.track(
                    frames=frames[window],
                    queries=queries,
                    depths=depths[window],
                    intrinsics=intrinsics[window],
                    extrinsics=extrinsics[window],
                    query_pixels=pixels,
                    masks=None if masks is None else np.asarray(masks[window], dtype=bool),
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
            "quality": track_quality(np.isfinite(tracks).all(axis=-1), num_points),
        }


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

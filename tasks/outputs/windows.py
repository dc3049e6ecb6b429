"""y2r's per-window rules, as its writer applies them (hgupt3/y2r dataset_scripts/create_h5_dataset.py at 0d82983).

Pure functions on arrays for the h5 stage: depth clipping (a negative depth kept, as y2r keeps it),
the 3D point filter, 2D pixel tracks and y2r's 2D rule, hand windows. Each follows y2r's dtype at
every step, so that the files equal y2r's to the value, edge points included.
"""

from __future__ import annotations

import numpy as np

from tasks.outputs.geometry import project_step, rot_6d


def clip_depth(depth: np.ndarray, depth_min: float, depth_max: float) -> np.ndarray:
    """Return float32 depth with non-finite values 0, (0, min) -> min, > max -> max; 0 and negatives as they are.

    y2r's ``clip_depth`` (create_h5_dataset.py L46-68) keeps a negative depth, and so do we, so that the files
    equal y2r's: a value <= 0 is invalid either way, and the statistics pool only depths > 0.
    """
    d = np.asarray(depth, dtype=np.float32)
    d = np.where(np.isfinite(d), d, np.float32(0))
    d = np.where((d > 0) & (d < depth_min), np.float32(depth_min), d)
    return np.where(d > depth_max, np.float32(depth_max), d).astype(np.float32)


def track_window(
    points: np.ndarray, K: np.ndarray, size: int, depth_min: float, depth_max: float
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``query_coords`` (N, 3) and ``displacements`` (L, N, 3) float32 of window-local points (L, P, 3).

    A point is kept only if u, v in [0, 1] and d > 0 at every step; the query depth is clipped
    to [depth_min, depth_max], the displacements are not. Each step is projected in float32
    with the crop's K, as y2r does (create_h5_dataset.py L446-471), so edge points agree.
    """
    pts = np.asarray(points, dtype=np.float32)
    uvd = np.zeros(pts.shape, dtype=np.float32)
    for t in range(len(pts)):
        uvd[t] = project_step(pts[t], K, size)
    with np.errstate(invalid="ignore"):
        inside = (uvd[..., 0] >= 0) & (uvd[..., 0] <= 1) & (uvd[..., 1] >= 0) & (uvd[..., 1] <= 1) & (uvd[..., 2] > 0)
    uvd = uvd[:, inside.all(axis=0)]
    query = uvd[0].copy()
    query[:, 2] = np.clip(query[:, 2], np.float32(depth_min), np.float32(depth_max))
    return query, uvd - uvd[0:1]


def frame_pixels(points: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Return pixel positions (L, P, 2) float32 at frame resolution of window-local points (L, P, 3).

    The 2D tracker's output (CoTracker's role) when 2D tracks come from the 3D tracks: each step
    projected with the frame's K in float32; a point on or behind the camera plane has no pixel
    and is NaN, which the crop test drops.
    """
    pts = np.asarray(points, dtype=np.float32)
    K = np.asarray(K, dtype=np.float32)
    out = np.full(pts.shape[:-1] + (2,), np.nan, dtype=np.float32)
    for t in range(len(pts)):
        uvd = project_step(pts[t], K, 1)
        front = uvd[:, 2] > 0
        out[t, front] = uvd[front, :2]
    return out


def track_window_2d(pixels: np.ndarray, crop_x: int, crop_y: int, side: int, size: int) -> tuple | None:
    """Return ``query_coords`` (N, 2) and ``displacements`` (L, N, 2) float32 of pixel tracks (L, P, 2), or None.

    y2r's 2D rule (create_h5_dataset.py L344-367 and L597-627), which its trainer expects. In
    docs/contracts.md's terms it replaces "keep a point only if u, v in [0, 1] at every step" and "a
    group is written even when N = 0": each step keeps, in query order, the points whose pixel
    lies inside the square crop at that step (0 <= x - crop_x < side, same for y, so u, v in
    [0, 1)), and then every step is cut to the smallest count. So row i of step t is the i-th
    point still inside at step t, not always query i: where a point leaves, the later rows of
    that step belong to other queries, and ``displacements`` mixes points. A window whose
    smallest count is 0 gets no group (None). The statistics pool what is written.
    """
    steps = []
    for step in np.asarray(pixels, dtype=np.float32):
        shifted = step.copy()
        shifted[:, 0] = step[:, 0] - crop_x
        shifted[:, 1] = step[:, 1] - crop_y
        with np.errstate(invalid="ignore"):
            inside = (shifted[:, 0] >= 0) & (shifted[:, 0] < side) & (shifted[:, 1] >= 0) & (shifted[:, 1] < side)
        steps.append(shifted[inside] * (size / side) / size)
    count = min(len(s) for s in steps) if steps else 0
    if count == 0:
        return None
    uv = np.stack([s[:count] for s in steps]).astype(np.float32)
    return uv[0], uv - uv[0:1]


def hand_window(wrist_poses: np.ndarray, K: np.ndarray, size: int) -> dict[str, np.ndarray]:
    """Return one side's four hand datasets for a window of wrist poses (L, 4, 4), unclipped.

    In float32 step by step as y2r's ``process_hand_poses_for_window`` (create_h5_dataset.py
    L115-140, L197-223): ``K @ p`` per step, R_t @ R_0^T per step.
    """
    P = np.asarray(wrist_poses, dtype=np.float32)
    uvd = np.zeros((len(P), 3), dtype=np.float32)
    rot = np.zeros((len(P), 6), dtype=np.float32)
    R0 = P[0, :3, :3]
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in range(len(P)):
            p = K @ P[t, :3, 3]
            uvd[t] = [p[0] / p[2] / size, p[1] / p[2] / size, P[t, 2, 3]]
            rot[t] = rot_6d(P[t, :3, :3] @ R0.T)
    return {
        "wrist_query_uvd": uvd[0].copy(),
        "wrist_uvd_displacements": uvd - uvd[0:1],
        "wrist_query_rot_6d": rot_6d(R0).astype(np.float32),
        "wrist_rot_displacements": rot,
    }

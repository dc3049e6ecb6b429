"""TAPIP3D's and CoTracker3's inputs and outputs as y2r uses them, converted to the track contracts (pure functions).

References are to hgupt3/y2r ``dataset_scripts/process_tapip3d.py``, ``process_cotracker.py`` and
``thirdparty/cotracker3/tap.py``, zbw001/TAPIP3D ``utils/inference_utils.py`` and
facebookresearch/co-tracker ``cotracker/predictor.py``.
"""

from __future__ import annotations

import numpy as np


def erode(mask: np.ndarray, pixels: int) -> np.ndarray:
    """Return ``mask`` (H, W) bool eroded by a (2p+1) square, as ``cv2.erode`` with a ones kernel does.

    OpenCV's default border for erosion counts outside pixels as set, so the image edge
    does not eat into a mask that touches it (y2r erodes with cv2, process_tapip3d.py:173-178).
    """
    m = np.asarray(mask, dtype=bool)
    if pixels <= 0:
        return m.copy()
    padded = np.pad(m, pixels, mode="constant", constant_values=True)
    H, W = m.shape
    out = np.ones_like(m)
    for dy in range(2 * pixels + 1):
        for dx in range(2 * pixels + 1):
            out &= padded[dy : dy + H, dx : dx + W]
    return out


def tapip3d_window_inputs(queries_cam: np.ndarray, extrinsics: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return TAPIP3D's ``query_point`` (N, 4) ``[t=0, x, y, z]`` and the ``extrinsics`` (L, 4, 4) y2r gives it.

    y2r passes the window's relative poses ``inv(E_0) @ E_t`` as TAPIP3D's world->camera
    extrinsics (process_tapip3d.py:446 and 453), so TAPIP3D's world is the window's first
    camera (the pose at t = 0 is the identity), and unprojects the queries through them
    (process_tapip3d.py:239-250): a query in the first camera's frame is that same point in
    TAPIP3D's world. ``queries_cam`` (N, 3) metres; ``extrinsics`` (L, 4, 4) world->camera.
    """
    E = np.asarray(extrinsics, dtype=np.float64)
    poses = np.linalg.inv(E[0]) @ E
    q = np.asarray(queries_cam, dtype=np.float64).reshape(-1, 3)
    world = camera_to_world(q, poses[0])
    query_point = np.concatenate([np.zeros((len(q), 1)), world], axis=1)
    return query_point.astype(np.float32), poses.astype(np.float32)


def camera_to_world(points: np.ndarray, world_to_cam: np.ndarray) -> np.ndarray:
    """Return points (N, 3) of one camera's frame in the world frame of the world->camera pose (4, 4)."""
    P = np.asarray(world_to_cam, dtype=np.float64)
    R, t = P[:3, :3], P[:3, 3]
    return (np.asarray(points, dtype=np.float64) - t) @ R  # R^T (p - t), row-vector form


def tapip3d_to_first_camera(coords: np.ndarray, visible: np.ndarray, world_to_cam0: np.ndarray) -> np.ndarray:
    """Return TAPIP3D's world-frame tracks (L, N, 3) in the first camera's frame, NaN for points y2r drops.

    ``coords`` (L, N, 3) and ``visible`` (L, N) bool are what TAPIP3D's ``inference`` returns
    (inference_utils.py:173-175); ``world_to_cam0`` (4, 4) is the pose it was given for step 0.
    y2r keeps only the points visible at every step (process_tapip3d.py:351-355); the
    contract keeps the array shape, so the others become NaN.
    """
    c = np.asarray(coords, dtype=np.float64).reshape(len(coords), -1, 3)
    P = np.asarray(world_to_cam0, dtype=np.float64)
    cam = c @ P[:3, :3].T + P[:3, 3]
    keep = np.asarray(visible, dtype=bool).reshape(c.shape[:2]).all(axis=0)
    cam[:, ~keep] = np.nan
    return cam.astype(np.float32)


def grid_on_mask(mask: np.ndarray, grid_size: int, margin_divisor: float = 64.0) -> np.ndarray:
    """Return the (N, 2) float pixels (x, y) of CoTracker's ``grid_size`` grid that fall on ``mask`` (H, W), row-major.

    CoTracker builds the grid with ``get_points_on_a_grid`` (model_utils.py:83-140: a margin of
    W/64, ``grid_size`` points per side, centred) at its model resolution and keeps the points
    whose rounded pixel is set in the mask (predictor.py:128-140). CoTracker3's resolution is
    384x512, the frames' own, so the points are pixels of the frame.
    """
    H, W = np.asarray(mask).shape
    if grid_size == 1:
        pts = np.array([[W / 2.0, H / 2.0]])
    else:
        margin = W / margin_divisor
        ys = np.linspace(margin, H - margin, grid_size)
        xs = np.linspace(margin, W - margin, grid_size)
        yy, xx = np.meshgrid(ys, xs, indexing="ij")
        pts = np.stack([xx.reshape(-1), yy.reshape(-1)], axis=-1)
    rows = np.clip(np.round(pts[:, 1]).astype(int), 0, H - 1)
    cols = np.clip(np.round(pts[:, 0]).astype(int), 0, W - 1)
    return pts[np.asarray(mask, dtype=bool)[rows, cols]]


def cotracker_queries(query_pixels: np.ndarray) -> np.ndarray:
    """Return CoTracker's ``queries`` (1, N, 3) ``[t=0, x, y]`` float32 for pixels (N, 2) of a window's first frame."""
    q = np.asarray(query_pixels, dtype=np.float32).reshape(-1, 2)
    return np.concatenate([np.zeros((len(q), 1), np.float32), q], axis=1)[None]


def cotracker_visible(visibility: np.ndarray, threshold: float) -> np.ndarray:
    """Return (L, N) bool: y2r's rule ``visibility > threshold`` (tap.py:59) on CoTracker's (1, L, N) output.

    CoTracker's predictor already returns booleans (``> 0.9``, predictor.py:170-171), so a
    threshold below 1 keeps exactly its visible steps, as in y2r.
    """
    v = np.asarray(visibility)
    return (v.reshape(v.shape[-2:]).astype(np.float32) > threshold).astype(bool)


def drop_not_always_visible(tracks: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Return 2D tracks (L, N, 2) float32 with NaN for every point not visible at every step.

    y2r keeps only the CoTracker points visible at all steps (tap.py:58-76); the contract
    keeps the array shape, so the others become NaN and no later rule can keep them.
    """
    out = np.array(tracks, dtype=np.float32, copy=True).reshape(len(tracks), -1, 2)
    out[:, ~np.asarray(visible, dtype=bool).reshape(out.shape[:2]).all(axis=0)] = np.nan
    return out

"""Pyramidal Lucas-Kanade point tracks with a forward-backward check, and their lifting to 3D.

Pure functions on NumPy arrays; OpenCV is imported inside them. Pixels are (u, v) at the
frame resolution; cameras follow docs/contracts.md (world->camera E, OpenCV axes, metres).
"""

from __future__ import annotations

from typing import Any

import numpy as np

LK_WINDOW_PX = 21
LK_LEVELS = 3


def to_gray(frames: np.ndarray) -> np.ndarray:
    """Return (T, H, W) uint8 luminance of RGB ``frames`` (T, H, W, 3)."""
    import cv2

    return np.stack([cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2GRAY) for f in frames])


def lk_step(gray0: np.ndarray, gray1: np.ndarray, pts: np.ndarray, fb_max_px: float) -> tuple[np.ndarray, np.ndarray]:
    """Track ``pts`` (N, 2) from ``gray0`` to ``gray1``; return new points and a (N,) bool of those kept.

    A point is dropped when either direction fails, when tracking it back lands more than
    ``fb_max_px`` from where it started, or when it leaves the frame.
    """
    import cv2

    if len(pts) == 0:
        return np.zeros((0, 2), np.float32), np.zeros(0, bool)
    criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 30, 0.01)
    p0 = np.ascontiguousarray(pts, dtype=np.float32).reshape(-1, 1, 2)
    kw: dict[str, Any] = {"winSize": (LK_WINDOW_PX, LK_WINDOW_PX), "maxLevel": LK_LEVELS, "criteria": criteria}
    p1, st1, _ = cv2.calcOpticalFlowPyrLK(gray0, gray1, p0, None, **kw)  # type: ignore[call-overload]
    back, st2, _ = cv2.calcOpticalFlowPyrLK(gray1, gray0, p1, None, **kw)  # type: ignore[call-overload]
    p1, back = p1.reshape(-1, 2), back.reshape(-1, 2)
    H, W = gray0.shape
    inside = (p1[:, 0] >= 0) & (p1[:, 0] <= W - 1) & (p1[:, 1] >= 0) & (p1[:, 1] <= H - 1)
    round_trip = np.linalg.norm(back - p0.reshape(-1, 2), axis=1)
    kept = st1.ravel().astype(bool) & st2.ravel().astype(bool) & inside & (round_trip <= fb_max_px)
    return p1, kept


def track_pixels(gray: np.ndarray, query_px: np.ndarray, fb_max_px: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Track ``query_px`` (N, 2) of frame 0 through ``gray`` (L, H, W); return tracks (L, N, 2) and visible (L, N).

    Frame to frame, each step checked forwards and backwards (``lk_step``); a point lost
    once stays lost: its positions are NaN and its visibility False from that step on.
    """
    L, N = len(gray), len(query_px)
    tracks = np.full((L, N, 2), np.nan, np.float32)
    alive = np.ones(N, bool)
    tracks[0] = query_px
    for t in range(1, L):
        idx = np.flatnonzero(alive)
        nxt, kept = lk_step(gray[t - 1], gray[t], tracks[t - 1, idx], fb_max_px)
        alive[idx[~kept]] = False
        tracks[t, idx[kept]] = nxt[kept]
    visible = np.isfinite(tracks[..., 0])
    return tracks, visible


def sample_depth(depth: np.ndarray, pixels: np.ndarray) -> np.ndarray:
    """Return the depth (N,) at the nearest pixel of each (u, v) in ``pixels`` (N, 2); NaN for NaN pixels."""
    H, W = depth.shape
    out = np.full(len(pixels), np.nan, np.float32)
    ok = np.isfinite(pixels).all(axis=1)
    u = np.clip(np.round(pixels[ok, 0]).astype(int), 0, W - 1)
    v = np.clip(np.round(pixels[ok, 1]).astype(int), 0, H - 1)
    out[ok] = depth[v, u]
    return out


def lift_tracks(tracks_px: np.ndarray, depths: np.ndarray, K: np.ndarray, E: np.ndarray) -> np.ndarray:
    """Return 3D tracks (L, N, 3) in the camera frame of step 0 from pixel tracks (L, N, 2).

    Step t's pixels are back-projected with that step's ``depths`` (L, H, W) and ``K`` (L, 3, 3),
    then moved from camera t to camera 0 with the world->camera ``E`` (L, 4, 4): x_0 = E_0 E_t^-1 x_t.
    Lost points and pixels without depth (<= 0 or not finite) are NaN.
    """
    L, N = tracks_px.shape[:2]
    out = np.full((L, N, 3), np.nan, np.float32)
    for t in range(L):
        d = sample_depth(np.asarray(depths[t], np.float32), tracks_px[t]).astype(np.float64)
        d[~(d > 0)] = np.nan
        uv1 = np.c_[tracks_px[t].astype(np.float64), np.ones(N)]
        cam_t = (uv1 @ np.linalg.inv(K[t]).T) * d[:, None]
        to_0 = E[0] @ np.linalg.inv(E[t])
        out[t] = cam_t @ to_0[:3, :3].T + to_0[:3, 3]
    return out

"""An independent re-statement of y2r's ``process_video`` (hgupt3/y2r dataset_scripts/create_h5_dataset.py).

Written from y2r's code, line by line where it matters, and from nothing in ``tasks/``: the
parity test feeds it framefleet's intermediates in the form y2r's writer reads (PNG frames,
the TAPIP3D/CoTracker track dicts, ViPE's float16 depth, the WiLoR hand dict) and compares
every dataset it would write with framefleet's file. Line numbers refer to that file at
hgupt3/y2r 0d82983.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np


def center_crop_and_resize(frame: np.ndarray, size: int, crop: tuple | None = None, interp: int = cv2.INTER_LANCZOS4):
    """L259-295: centre square crop of side min(h, w), then cv2.resize to size x size."""
    if crop is None:
        h, w = frame.shape[:2]
        side = min(h, w)
        crop = ((w - side) // 2, (h - side) // 2, side)
    x, y, side = crop
    return cv2.resize(frame[y : y + side, x : x + side], (size, size), interpolation=interp), crop


def transform_intrinsics(K: np.ndarray, x: int, y: int, side: int, size: int) -> np.ndarray:
    """L298-319: in K's dtype, in place on a copy."""
    K = K.copy()
    K[0, 2] -= x
    K[1, 2] -= y
    scale = size / side
    K[0, :] *= scale
    K[1, :] *= scale
    return K


def clip_depth(depth: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """L46-68: non-finite -> 0; (0, lo) -> lo; > hi -> hi; 0 and negatives untouched."""
    depth = np.where(np.isfinite(depth), depth, 0.0)
    valid = depth > 0
    depth = np.where(valid & (depth < lo), lo, depth)
    return np.where(valid & (depth > hi), hi, depth)


def project(points: np.ndarray, K: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """L147-174 with img_size (size, size)."""
    uv = (K @ points.T).T
    with np.errstate(divide="ignore", invalid="ignore"):
        return uv[:, 0] / uv[:, 2] / size, uv[:, 1] / uv[:, 2] / size, points[:, 2]


def frame_pixels(points: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Pixels (L, P, 2) of window-local points (L, P, 3) seen by the frame's camera ``K``: per step L147-174's
    ``(K @ p.T).T`` then ``u / w``, ``v / w`` in float32 (img_size 1); no pixel (NaN) where the depth is <= 0.

    Not from y2r, which gets its 2D tracks from CoTracker: the stand-in for CoTracker that framefleet's 2D
    mode uses without the tracks2d stage (its 3D tracks seen by the frame's camera), computed here from the
    projection formula alone so that the parity test does not take framefleet's own pixels as truth.
    """
    K = np.asarray(K, dtype=np.float32)
    out = np.full(points.shape[:-1] + (2,), np.nan, dtype=np.float32)
    for t, step in enumerate(np.asarray(points, dtype=np.float32)):
        uvw = (K @ step.T).T
        front = step[:, 2] > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            out[t, front, 0] = (uvw[:, 0] / uvw[:, 2])[front]
            out[t, front, 1] = (uvw[:, 1] / uvw[:, 2])[front]
    return out


def wrist_uvd(p: np.ndarray, K: np.ndarray, size: int) -> np.ndarray:
    """L115-140."""
    uv = K @ p
    return np.array([uv[0] / uv[2] / size, uv[1] / uv[2] / size, p[2]], dtype=np.float32)


def six_d(R: np.ndarray) -> np.ndarray:
    """L80-83: columns 0 and 1."""
    return np.concatenate([R[:, 0], R[:, 1]])


def hand_window(poses: np.ndarray, K: np.ndarray, size: int, n: int) -> tuple:
    """L181-223."""
    T = min(poses.shape[0], n)
    uvd = np.zeros((T, 3), dtype=np.float32)
    for t in range(T):
        uvd[t] = wrist_uvd(poses[t, :3, 3], K, size)
    R0 = poses[0, :3, :3]
    rot = np.zeros((T, 6), dtype=np.float32)
    for t in range(T):
        rot[t] = six_d(poses[t, :3, :3] @ R0.T)
    return uvd[0], uvd - uvd[0:1], six_d(R0), rot


def transform_2d(tracks: np.ndarray, x: int, y: int, side: int, size: int) -> np.ndarray:
    """L328-367: shift by the crop, keep points inside [0, side), scale, normalise."""
    if tracks.shape[0] == 0:
        return tracks
    c = tracks.copy()
    c[:, 0] = tracks[:, 0] - x
    c[:, 1] = tracks[:, 1] - y
    with np.errstate(invalid="ignore"):
        c = c[(c[:, 0] >= 0) & (c[:, 0] < side) & (c[:, 1] >= 0) & (c[:, 1] < side)]
    if c.shape[0] == 0:
        return c
    return c * (size / side) / size


def window_3d(pts: np.ndarray, K: np.ndarray, size: int, depth_min: float, depth_max: float) -> tuple:
    """L446-471 and L682-688: (query (N, 3), displacements (L, N, 3)) of one window's points (L, P, 3)."""
    n = pts.shape[0]
    uvd = np.zeros((n, pts.shape[1], 3), dtype=np.float32)  # L446-453
    for t in range(n):
        uvd[t, :, 0], uvd[t, :, 1], uvd[t, :, 2] = project(pts[t], K, size)
    with np.errstate(invalid="ignore"):
        ok = (uvd[:, :, 0] >= 0) & (uvd[:, :, 0] <= 1) & (uvd[:, :, 1] >= 0) & (uvd[:, :, 1] <= 1)
        ok &= uvd[:, :, 2] > 0
    uvd = uvd[:, ok.all(axis=0), :]
    query, disp = uvd[0], uvd - uvd[0:1]
    query[:, 2] = clip_depth(query[:, 2], depth_min, depth_max)  # L682-688, after disp
    return query, disp


def window_2d(tracks: np.ndarray, x: int, y: int, side: int, size: int) -> tuple | None:
    """L597-627: (query (N, 2), displacements (L, N, 2)) of one window's pixel tracks (L, P, 2), None for no group."""
    steps = [transform_2d(tracks[ts], x, y, side, size) for ts in range(tracks.shape[0])]
    m = min(s.shape[0] for s in steps)
    if m == 0:
        return None  # L613-616
    stacked = np.stack([s[:m] for s in steps], axis=0).astype(np.float32)
    return stacked[0].astype(np.float32), (stacked - stacked[0:1]).astype(np.float32)


def process_video(
    frame_files: list[Path],
    track_data: dict[str, Any],
    track_type: str,
    depths_f16: np.ndarray | None = None,
    hand_data: dict[str, np.ndarray] | None = None,
    text: str = "",
    size: int = 256,
    n: int = 10,
    depth_min: float = 0.1,
    depth_max: float = 2.5,
) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]:
    """L517-788: return ({dataset path: value} as y2r writes them, {statistic: sample arrays})."""
    frames, crop = [], None
    for path in frame_files:  # L553-561: cv2.imread is BGR
        rgb = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
        out, c = center_crop_and_resize(rgb, size)
        frames.append(out)
        crop = crop or c
    x, y, side = crop
    T = len(frames)
    out: dict[str, Any] = {"root/video": np.transpose(np.stack(frames), (0, 3, 1, 2)).astype(np.uint8)}
    pools: dict[str, list[np.ndarray]] = {k: [] for k in ("disp", "depth", "pose", "hand_uvd", "hand_rot")}
    windows = track_data["windows"]
    if track_type == "2d":  # L587-630
        window_map = {
            s: tr[0][:n] for (s, e), tr in zip(windows, track_data["tracks"], strict=True) if tr[0].shape[0] >= n
        }
        for t in range(T):
            if t not in window_map:
                continue
            window = window_2d(window_map[t], x, y, side, size)
            if window is None:
                continue  # L613-616: no group
            out[f"root/tracks/frame_{t:04d}/query_coords"], out[f"root/tracks/frame_{t:04d}/displacements"] = window
            pools["disp"].append(window[1])
    else:  # L632-695
        K = transform_intrinsics(track_data["intrinsics"], x, y, side, size)
        depth = []
        for t in range(min(T, depths_f16.shape[0])):
            d, _ = center_crop_and_resize(depths_f16[t].astype(np.float32), size, crop, cv2.INTER_NEAREST)
            d = clip_depth(d, depth_min, depth_max)
            depth.append(d)
            if (d > 0).any():
                pools["depth"].append(d[d > 0])
        out["root/depth"] = np.stack(depth).astype(np.float32)
        out["root/intrinsics"] = K.astype(np.float32)
        for (s, _e), tr, poses in zip(windows, track_data["tracks"], track_data["window_poses"], strict=True):
            if tr[0].shape[0] < n:
                continue
            pts, poses = tr[0][:n], poses[:n]
            query, disp = window_3d(pts, K, size, depth_min, depth_max)
            p9 = np.zeros((n, 9), dtype=np.float32)  # L92-97
            for t in range(n):
                p9[t] = np.concatenate([six_d(poses[t, :3, :3]), poses[t, :3, 3]])
            g = f"root/tracks/frame_{s:04d}/"
            out[g + "query_coords"], out[g + "displacements"], out[g + "poses"] = query, disp, p9
            if query[:, 2][query[:, 2] > 0].size:
                pools["depth"].append(query[:, 2][query[:, 2] > 0])
            pools["pose"].append(p9)
            if disp.shape[1] > 0:
                pools["disp"].append(disp)
            for side_name in ("left", "right") if hand_data is not None else ():  # L226-252, L476-497
                if hand_data[f"{side_name}_valid"][np.arange(s, s + n)].all():
                    parts = hand_window(hand_data[f"{side_name}_wrist_pose"][np.arange(s, s + n)], K, size, n)
                    keys = (
                        "wrist_query_uvd",
                        "wrist_uvd_displacements",
                        "wrist_query_rot_6d",
                        "wrist_rot_displacements",
                    )
                    for key, value in zip(keys, parts, strict=True):
                        out[f"{g}{side_name}_{key}"] = value.astype(np.float32)
                    pools["hand_uvd"].append(parts[1])
                    pools["hand_rot"].append(parts[3])
    out["root/num_frames"] = np.int64(T)  # L761-768
    out["root/num_track_ts"] = np.int64(n)
    out["root/track_type"] = track_type
    if text:
        out["root/text"] = text
    return out, pools


def float64_stats(pools: dict[str, list[np.ndarray]], track_type: str) -> dict[str, Any]:
    """L795-915 and L1285-1313, pooled in one float64 pass (y2r pools in float32; the contract fixes float64)."""

    def pooled(parts: list[np.ndarray], dim: int) -> tuple[list, list, int]:
        if not parts:
            return [0.0] * dim, [1.0] * dim, 0
        x = np.concatenate([p.reshape(-1, dim) for p in parts]).astype(np.float64)
        return x.mean(axis=0).tolist(), x.std(axis=0).tolist(), len(x)

    dim = 3 if track_type == "3d" else 2
    m, s, c = pooled(pools["disp"], dim)
    out: dict[str, Any] = {
        "track_type": track_type,
        "track_dim": dim,
        "displacement_mean": m,
        "displacement_std": s,
        "displacement_num_samples": c,
    }
    if track_type == "3d":
        m, s, c = pooled(pools["depth"], 1)
        out.update(depth_mean=m[0], depth_std=s[0], depth_num_samples=c)
        m, s, c = pooled(pools["pose"], 9)
        out.update(pose_mean=m, pose_std=s, pose_num_samples=c)
        if pools["hand_uvd"]:
            m, s, c = pooled(pools["hand_uvd"], 3)
            out.update(hand_uvd_disp_mean=m, hand_uvd_disp_std=s, hand_pose_num_samples=c)
            m, s, _ = pooled(pools["hand_rot"], 6)
            out.update(hand_rot_disp_mean=m, hand_rot_disp_std=s)
    return out

"""framefleet verify --y2r-strict: the rules by which y2r's own writer differs from a looser reading of the contract.

Checked on the files alone: a 2D window has at least one point (y2r writes no group for an
empty one) and its u, v lie in [0, 1) (y2r keeps a pixel x - crop_x < side). Checked where the
run's intermediates are still in OUT/work/<video_id>/: the stored K is y2r's float32 computation
from the tracks' K (create_h5_dataset.py L298-319); the video is ``cv2.resize(..., INTER_LANCZOS4)``
of the preprocessed frames, pixel for pixel (L259-295); each window keeps as many points as
y2r's rule gives (3D: inside at every step, projected in float32, L446-465; 2D: per-step crop
test, then the smallest count, L597-627, on the tracks2d stage's pixels when it ran). Line
numbers: hgupt3/y2r at 0d82983.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np


def _load(path: Path) -> dict[str, np.ndarray] | None:
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _y2r_K(K: np.ndarray, x: int, y: int, side: int, size: int) -> np.ndarray:
    K = K.copy()
    K[0, 2] -= x
    K[1, 2] -= y
    K[0, :] *= size / side
    K[1, :] *= size / side
    return K


def _count_3d(points: np.ndarray, K: np.ndarray, size: int) -> int:
    ok = np.ones(points.shape[1], dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        for step in points:
            uv = (K @ np.ascontiguousarray(step).T).T
            u, v = (uv[:, 0] / uv[:, 2] / size).astype(np.float32), (uv[:, 1] / uv[:, 2] / size).astype(np.float32)
            ok &= (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1) & (step[:, 2] > 0)
    return int(ok.sum())


def _count_2d(points: np.ndarray, K_frame: np.ndarray | None, x: int, y: int, side: int) -> int:
    """y2r's 2D count of pixel tracks (L, N, 2), or of 3D tracks (L, N, 3) seen by the frame's camera K_frame."""
    counts = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for step in points:
            if K_frame is None:
                px, py, front = step[:, 0] - x, step[:, 1] - y, True
            else:
                uv = (K_frame @ np.ascontiguousarray(step).T).T
                px, py, front = uv[:, 0] / uv[:, 2] - x, uv[:, 1] / uv[:, 2] - y, step[:, 2] > 0
            counts.append(int((front & (px >= 0) & (px < side) & (py >= 0) & (py < side)).sum()))
    return min(counts) if counts else 0


def check_file(path: Path, tt: str, work: Path) -> list[str]:
    """Return the y2r-strict problems of one HDF5 file, using ``work`` (OUT/work/<id>) when it exists."""
    problems: list[str] = []
    with h5py.File(path, "r") as f:
        root = f["root"]
        groups = {int(name.split("_")[1]): root["tracks"][name] for name in root["tracks"]}
        n = int(root["num_track_ts"][()])
        if tt == "2d":
            for start, g in sorted(groups.items()):
                q = g["query_coords"][()]
                if len(q) == 0:
                    problems.append(
                        f"{path.name}: window {start} is empty; y2r writes no group for a 2D window "
                        "whose smallest per-step count is 0"
                    )
                elif np.any(q >= 1):  # later steps are stored as differences: only step 0 is exact
                    problems.append(f"{path.name}: window {start} has u or v = 1; y2r keeps x - crop_x < side only")
        pre, tracks = _load(work / "preprocess.npz"), _load(work / "tracks.npz")
        if pre is None or tracks is None:
            return problems
        import cv2

        H, W = pre["frames"].shape[1:3]
        side = min(H, W)
        x, y = (W - side) // 2, (H - side) // 2
        size = root["video"].shape[-1]
        want = np.stack(
            [
                cv2.resize(fr[y : y + side, x : x + side], (size, size), interpolation=cv2.INTER_LANCZOS4)
                for fr in pre["frames"]
            ]
        ).transpose(0, 3, 1, 2)
        if want.shape != root["video"].shape or not np.array_equal(want, root["video"][()]):
            differ = float(np.mean(want != root["video"][()])) if want.shape == root["video"].shape else 1.0
            problems.append(
                f"{path.name}: video is not cv2 INTER_LANCZOS4 of the preprocessed frames "
                f"({differ:.1%} of values differ)"
            )
        K = _y2r_K(tracks["intrinsics"], x, y, side, size)
        if tt == "3d" and not np.array_equal(root["intrinsics"][()], K.astype(np.float32)):
            problems.append(
                f"{path.name}: intrinsics {root['intrinsics'][()].tolist()} are not y2r's float32 "
                f"steps {K.astype(np.float32).tolist()}"
            )
        pixels = _load(work / "tracks2d.npz") if tt == "2d" else None
        source = tracks if pixels is None else pixels
        for w, start in enumerate(source["window_starts"].tolist()):
            pts = source["tracks"][w, :n, : int(source["num_points"][w])].astype(np.float32)
            if pts.shape[0] < n:
                continue
            if tt == "3d":
                count = _count_3d(pts, K, size)
            else:
                count = _count_2d(pts, None if pixels is not None else tracks["intrinsics"], x, y, side)
            have = len(groups[start]["query_coords"]) if start in groups else 0
            if have != count:
                problems.append(f"{path.name}: window {start} keeps {have} points, y2r's {tt} rule keeps {count}")
    return problems

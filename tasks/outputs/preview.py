"""A preview image per video: the first frame with its tracks and hand joints, its depth beside it.

scripts/preview.py writes one per video beside its HDF5 file; the report shows them beside the
videos' quality. Drawn from the stage intermediates under OUT/work/: left, frame 0 with the first
window's point tracks (a line per point through its steps, a dot where it starts) and frame 0's
hand joints (left hand blue, right hand red); right, frame 0's depth (near is bright).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tasks.outputs.stage_io import output_path
from tasks.outputs.storage import load_npz
from tasks.stages import DepthStage, HandsStage, PreprocessStage, TracksStage

BONES = [
    (0, 1),
    (1, 2),
    (2, 3),
    (3, 4),
    (0, 5),
    (5, 6),
    (6, 7),
    (7, 8),
    (5, 9),
    (9, 10),
    (10, 11),
    (11, 12),
    (9, 13),
    (13, 14),
    (14, 15),
    (15, 16),
    (13, 17),
    (0, 17),
    (17, 18),
    (18, 19),
    (19, 20),
]
SIDE_COLOURS = {"left": (40, 120, 255), "right": (255, 60, 40)}  # RGB


def project(points: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Return pixels (..., 2) of camera-frame points (..., 3); NaN where a point is NaN or behind the camera."""
    h = points @ K.T
    with np.errstate(divide="ignore", invalid="ignore"):
        px = h[..., :2] / h[..., 2:3]
    px[~(points[..., 2] > 0)] = np.nan
    return px


def render(frames: np.ndarray, depth: np.ndarray, tracks: dict, hands: dict) -> np.ndarray:
    """Return the preview image (H, 2W, 3) uint8 RGB of one video."""
    import cv2

    image = np.ascontiguousarray(frames[0].copy())
    K = np.asarray(tracks["intrinsics"], np.float64)
    if len(tracks["num_points"]):
        n = int(tracks["num_points"][0])
        px = project(np.asarray(tracks["tracks"][0, :, :n], np.float64), K)  # (L, n, 2)
        for i in range(n):
            line = px[:, i][np.isfinite(px[:, i]).all(axis=1)]
            if len(line):
                cv2.polylines(image, [np.round(line).astype(np.int32)], False, (255, 230, 0), 1, cv2.LINE_AA)
                cv2.circle(image, tuple(int(c) for c in np.round(line[0])), 2, (0, 255, 0), -1)
    for row, (side, colour) in enumerate(SIDE_COLOURS.items()):
        valid = np.asarray(hands.get(f"{side}_valid", [False]))
        joints = project(np.asarray(hands[f"{side}_joints_3d"][0], np.float64), K) if valid[0] else None
        if joints is None or not np.isfinite(joints).all():
            cv2.putText(
                image, f"no {side} hand", (8, 20 + 18 * row), cv2.FONT_HERSHEY_SIMPLEX, 0.5, colour, 1, cv2.LINE_AA
            )
            continue
        pts = np.round(joints).astype(int)
        for a, b in BONES:
            cv2.line(image, tuple(pts[a]), tuple(pts[b]), colour, 2, cv2.LINE_AA)
        cv2.putText(image, side, tuple(pts[0] + [4, 14]), cv2.FONT_HERSHEY_SIMPLEX, 0.5, colour, 1, cv2.LINE_AA)
    d = np.asarray(depth, np.float32)
    ok = np.isfinite(d) & (d > 0)
    lo, hi = np.percentile(d[ok], [2, 98]) if ok.any() else (0.0, 1.0)
    norm = np.clip((hi - d) / max(hi - lo, 1e-6), 0, 1)  # near is bright
    coloured = np.ascontiguousarray(cv2.applyColorMap((norm * 255).astype(np.uint8), cv2.COLORMAP_INFERNO)[..., ::-1])
    cv2.putText(
        coloured, f"depth {lo:.2f}-{hi:.2f} m", (8, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (255, 255, 255), 1, cv2.LINE_AA
    )
    return np.concatenate([image, coloured], axis=1)


def write_preview(out_root: Path, video_id: str, path: Path | None = None, width: int | None = None) -> Path:
    """Render and write OUT/{video_id}.preview.png (or ``path``, scaled to ``width`` px); return its path.

    Raises FileNotFoundError when the video's intermediates are not in OUT/work/.
    """
    from PIL import Image

    def output(stage: Any) -> dict:
        return load_npz(output_path(out_root, video_id, stage.name))

    pre, depth = output(PreprocessStage), output(DepthStage)
    image = render(pre["frames"], depth["depths"][0], output(TracksStage), output(HandsStage))
    picture = Image.fromarray(image)
    if width:
        picture = picture.resize((width, max(1, round(image.shape[0] * width / image.shape[1]))))
    path = path or out_root / f"{video_id}.preview.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    return path

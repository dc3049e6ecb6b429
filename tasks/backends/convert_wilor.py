"""WiLoR's detections and outputs turned into wrist poses and joints in the camera frame, as y2r does (pure).

References are to hgupt3/y2r ``dataset_scripts/process_wilor.py`` and rolpotamias/WiLoR
``wilor/utils/renderer.py``.
"""

from __future__ import annotations

import numpy as np


def best_per_side(confidence: np.ndarray, is_right: np.ndarray) -> dict[str, int | None]:
    """Return the index of the most confident detection per side ("left", "right"), None where there is none.

    ``confidence`` (N,) and ``is_right`` (N,) (the detector's class, 1 for a right hand) are
    one frame's detections; the first of equal confidences wins (process_wilor.py:126-155).
    """
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    right = np.asarray(is_right).reshape(-1).astype(bool)
    out: dict[str, int | None] = {}
    for side, want in (("left", False), ("right", True)):
        idx = np.flatnonzero(right == want)
        out[side] = int(idx[np.argmax(conf[idx])]) if len(idx) else None
    return out


def cam_crop_to_full(
    pred_cam: np.ndarray, box_center: np.ndarray, box_size: np.ndarray, img_size: np.ndarray, focal: np.ndarray
) -> np.ndarray:
    """Return the full-image camera translation (N, 3) of WiLoR's crop camera ``[s, tx, ty]`` (N, 3).

    WiLoR's formula (renderer.py:12-22): ``bs = box_size * s``, ``tz = 2 f / bs``,
    ``tx' = 2 (cx - W/2) / bs + tx``, ``ty' = 2 (cy - H/2) / bs + ty``; ``box_center`` (N, 2)
    and ``img_size`` (N, 2) = (W, H) in pixels, ``focal`` (N,) pixels.
    """
    cam = np.asarray(pred_cam, dtype=np.float64)
    center = np.asarray(box_center, dtype=np.float64)
    size = np.asarray(img_size, dtype=np.float64)
    bs = np.asarray(box_size, dtype=np.float64).reshape(-1) * cam[:, 0] + 1e-9
    tz = 2.0 * np.asarray(focal, dtype=np.float64).reshape(-1) / bs
    tx = 2.0 * (center[:, 0] - size[:, 0] / 2.0) / bs + cam[:, 1]
    ty = 2.0 * (center[:, 1] - size[:, 1] / 2.0) / bs + cam[:, 2]
    return np.stack([tx, ty, tz], axis=-1)


def full_image_translation(
    pred_cam: np.ndarray,
    box_center: np.ndarray,
    box_size: np.ndarray,
    img_size: np.ndarray,
    is_right: np.ndarray,
    focal_length: float,
    model_image_size: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(cam_t (N, 3), focal (N,))``: WiLoR's translation in the full image and the focal length it assumes.

    As y2r does (process_wilor.py:650-665): ``tx`` flips sign for left hands, and the focal
    length is the config's ``EXTRA.FOCAL_LENGTH / MODEL.IMAGE_SIZE`` times the image's longer side.
    """
    cam = np.array(pred_cam, dtype=np.float64, copy=True)
    cam[:, 1] *= 2.0 * np.asarray(is_right, dtype=np.float64).reshape(-1) - 1.0
    focal = focal_length / model_image_size * np.asarray(img_size, dtype=np.float64).max(axis=1)
    return cam_crop_to_full(cam, box_center, box_size, img_size, focal), focal


def mirror_left(points: np.ndarray, is_right: float) -> np.ndarray:
    """Return WiLoR's points (..., 3) with x negated for a left hand (process_wilor.py:681-684)."""
    p = np.array(points, dtype=np.float64, copy=True)
    p[..., 0] *= 2.0 * float(is_right) - 1.0
    return p


def wrist_pixel(joints: np.ndarray, cam_t: np.ndarray, focal: float, width: int, height: int) -> tuple[int, int]:
    """Return the wrist's integer pixel (u, v), clipped to the image, from WiLoR's own camera.

    The wrist joint (index 0, already mirrored) plus ``cam_t`` is projected with focal
    ``focal`` and the image centre as principal point, then truncated (process_wilor.py:686-697).
    """
    p = np.asarray(joints, dtype=np.float64)[0] + np.asarray(cam_t, dtype=np.float64)
    u = focal * p[0] / p[2] + width / 2.0
    v = focal * p[1] / p[2] + height / 2.0
    return int(np.clip(u, 0, width - 1)), int(np.clip(v, 0, height - 1))


def wrist_depth(depth: np.ndarray, u: int, v: int, search: int = 9) -> float | None:
    """Return the depth (m) at pixel (u, v), else the first valid one 1..``search`` px up, down, left, right; or None.

    process_wilor.py:700-716; a depth is valid when finite and > 0.
    """
    d = np.asarray(depth)
    H, W = d.shape
    value = float(d[v, u])
    if value > 0 and np.isfinite(value):
        return value
    for offset in range(1, search + 1):
        for dv, du in ((-offset, 0), (offset, 0), (0, -offset), (0, offset)):
            nv, nu = v + dv, u + du
            if 0 <= nv < H and 0 <= nu < W:
                candidate = float(d[nv, nu])
                if candidate > 0 and np.isfinite(candidate):
                    return candidate
    return None


def backproject(u: float, v: float, depth: float, K: np.ndarray) -> np.ndarray:
    """Return the camera-frame point (3,) of pixel (u, v) at ``depth`` metres with intrinsics ``K`` (3, 3)."""
    K = np.asarray(K, dtype=np.float64)
    return np.array([(u - K[0, 2]) * depth / K[0, 0], (v - K[1, 2]) * depth / K[1, 1], depth])


HAND_FRAMES = ("y2r", "camera")
MIRROR_X = np.diag([-1.0, 1.0, 1.0])


def place_hand(
    global_orient: np.ndarray,
    joints: np.ndarray,
    wrist_position: np.ndarray,
    is_right: float = 1.0,
    frame: str = "y2r",
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(wrist_pose (4, 4), joints_3d (21, 3))`` in the camera frame; ``joints`` (21, 3) already mirrored.

    ``frame`` "y2r" (process_wilor.py:723-731): the rotation is MANO's global orient (3, 3) as
    WiLoR gives it, and the joints relative to the wrist are rotated by it once more, although
    MANO's joints already carry that rotation; the joints are then moved to ``wrist_position``.
    "camera": the joints relative to the wrist are moved there as they are, and a left hand's
    rotation is mirrored (``M R M``, M = diag(-1, 1, 1)) since WiLoR saw it flipped as a right
    hand: both then describe the hand in the camera frame (README, "Two geometry conventions").
    """
    if frame not in HAND_FRAMES:
        raise ValueError(f"hand frame must be one of {HAND_FRAMES}, got {frame!r}")
    R = np.asarray(global_orient, dtype=np.float64).reshape(3, 3)
    local = np.asarray(joints, dtype=np.float64) - np.asarray(joints, dtype=np.float64)[:1]
    if frame == "camera":
        if float(is_right) < 0.5:
            R = MIRROR_X @ R @ MIRROR_X
    else:
        local = local @ R.T
    pose = np.eye(4)
    pose[:3, :3] = R
    pose[:3, 3] = wrist_position
    return pose, local + np.asarray(wrist_position, dtype=np.float64)

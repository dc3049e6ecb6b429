"""Hand landmarks (MediaPipe's 21, same order as MANO's joints in y2r) to the hands contract: wrist pose and joints.

Pure functions on NumPy arrays; OpenCV (for PnP) is imported inside ``wrist_from_pnp``.
Cameras follow docs/contracts.md: OpenCV axes, metres, pixels at the frame resolution.
"""

from __future__ import annotations

import numpy as np

WRIST, INDEX_MCP, MIDDLE_MCP, PINKY_MCP = 0, 5, 9, 17
# y2r adds this to the depth read at the wrist pixel: the wrist joint lies about 2 cm
# inside the skin the depth sensor sees (hgupt3/y2r dataset_scripts/config.yaml:182,
# applied in dataset_scripts/process_wilor.py:718).
WRIST_DEPTH_OFFSET_M = 0.02


def side_of(label: str, mirrored_input: bool = False) -> str:
    """Return "left" or "right" for MediaPipe's handedness ``label`` on a camera (not mirrored) image.

    MediaPipe labels hands as if the image were a mirrored selfie (its documentation: "If it
    is not the case, please swap the handedness output"), so for a camera image the label
    is swapped.
    """
    side = label.strip().lower()
    if side not in ("left", "right"):
        raise ValueError(f"handedness label must be 'Left' or 'Right', got {label!r}")
    if mirrored_input:
        return side
    return "left" if side == "right" else "right"


def palm_rotation(joints: np.ndarray, side: str) -> np.ndarray:
    """Return the palm frame (3, 3) of ``joints`` (21, 3): x from wrist to middle knuckle, z out of the palm.

    The palm normal comes from the wrist, index and pinky knuckles (0, 5, 17); for a left hand
    the cross product turns the other way, so it is flipped to keep z on the same anatomical
    side and the matrix a rotation for both hands.
    """
    j = np.asarray(joints, dtype=np.float64)
    x = j[MIDDLE_MCP] - j[WRIST]
    x /= np.linalg.norm(x)
    n = np.cross(j[INDEX_MCP] - j[WRIST], j[PINKY_MCP] - j[WRIST])
    if side == "left":
        n = -n
    z = n - np.dot(n, x) * x
    z /= np.linalg.norm(z)
    return np.stack([x, np.cross(z, x), z], axis=1)


def unproject_pixel(u: float, v: float, depth_m: float, K: np.ndarray) -> np.ndarray:
    """Return the camera-frame point (3,) of pixel (u, v) at depth ``depth_m``."""
    return np.array([(u - K[0, 2]) * depth_m / K[0, 0], (v - K[1, 2]) * depth_m / K[1, 1], depth_m])


def depth_at(depth: np.ndarray, u: float, v: float, search_px: int = 9) -> float | None:
    """Return the valid depth at pixel (u, v), else the first valid one up to ``search_px`` away on a cross; else None.

    This is y2r's search (dataset_scripts/process_wilor.py:700-711).
    """
    H, W = depth.shape
    uc, vc = int(np.clip(u, 0, W - 1)), int(np.clip(v, 0, H - 1))
    d = float(depth[vc, uc])
    if d > 0 and np.isfinite(d):
        return d
    for r in range(1, search_px + 1):
        for dv, du in ((-r, 0), (r, 0), (0, -r), (0, r)):
            if 0 <= vc + dv < H and 0 <= uc + du < W:
                d = float(depth[vc + dv, uc + du])
                if d > 0 and np.isfinite(d):
                    return d
    return None


def wrist_from_depth(
    wrist_px: np.ndarray, depth: np.ndarray, K: np.ndarray, offset_m: float = WRIST_DEPTH_OFFSET_M
) -> np.ndarray | None:
    """Return the wrist (3,) from its pixel back-projected at the frame's depth plus ``offset_m`` (y2r's rule)."""
    d = depth_at(depth, float(wrist_px[0]), float(wrist_px[1]))
    if d is None:
        return None
    return unproject_pixel(float(wrist_px[0]), float(wrist_px[1]), d + offset_m, K)


def wrist_from_pnp(world: np.ndarray, image_px: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Return (R, wrist (3,)) fitting the metric ``world`` landmarks (21, 3) to their pixels (21, 2) with K.

    R maps the landmarks' frame to the camera's; the wrist is landmark 0 in camera coordinates.
    """
    import cv2

    ok, rvec, tvec = cv2.solvePnP(
        np.asarray(world, np.float64),
        np.asarray(image_px, np.float64),
        np.asarray(K, np.float64),
        None,
        flags=cv2.SOLVEPNP_SQPNP,
    )
    if not ok:
        return None
    R, _ = cv2.Rodrigues(rvec)
    wrist = R @ np.asarray(world[WRIST], np.float64) + tvec.ravel()
    if wrist[2] <= 0:
        return None
    return R, wrist


def hand_in_camera(
    world: np.ndarray, image_px: np.ndarray, K: np.ndarray, side: str, depth: np.ndarray | None, wrist: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """Return (wrist_pose (4, 4), joints (21, 3)) in the camera frame, or None when the wrist cannot be placed.

    ``world`` (21, 3) are MediaPipe's metric world landmarks, ``image_px`` (21, 2) its pixels.
    Both orient the hand by a PnP fit of the world landmarks to their pixels. ``wrist="pnp"``
    also places it by that fit; ``wrist="depth"`` places the wrist by y2r's rule instead (its
    pixel back-projected at the frame's depth plus 2 cm).
    """
    if wrist not in ("pnp", "depth"):
        raise ValueError(f"wrist must be 'pnp' or 'depth', got {wrist!r}")
    if wrist == "depth" and depth is None:
        raise ValueError("wrist='depth' needs the depth stage's depths; pass them or use wrist='pnp'")
    fit = wrist_from_pnp(world, image_px, K)
    if fit is None:
        return None
    R, pos = fit
    if wrist == "depth":
        assert depth is not None  # checked above
        at = wrist_from_depth(image_px[WRIST], depth, K)
        if at is None:
            return None
        pos = at
    joints = (np.asarray(world, np.float64) - world[WRIST]) @ R.T + pos
    pose = np.eye(4)
    pose[:3, :3] = palm_rotation(joints, side)
    pose[:3, 3] = pos
    return pose, joints

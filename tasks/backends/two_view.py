"""Two-view geometry for the classical camera backend: intrinsics from a field of view, motion between frames, depth.

Pure functions on NumPy arrays; OpenCV is imported inside the functions that need it, so
importing this module stays cheap. Cameras follow docs/contracts.md: OpenCV axes, pixels, and
world->camera matrices E with x_cam = E @ x_world.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def fov_intrinsics(width: int, height: int, fov_degrees: float) -> np.ndarray:
    """Return [fx, fy, cx, cy] in pixels for a pinhole camera whose horizontal field of view is ``fov_degrees``."""
    if not 0 < fov_degrees < 180:
        raise ValueError(f"fov_degrees must lie in (0, 180), got {fov_degrees}; 60 suits most phone and web cameras")
    f = (width / 2.0) / np.tan(np.deg2rad(fov_degrees) / 2.0)
    return np.array([f, f, width / 2.0, height / 2.0])


def k_matrix(fx_fy_cx_cy: np.ndarray) -> np.ndarray:
    """Return the 3x3 K of [fx, fy, cx, cy]."""
    fx, fy, cx, cy = np.asarray(fx_fy_cx_cy, dtype=np.float64).reshape(4)
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def nearest_rotation(M: np.ndarray) -> np.ndarray:
    """Return the rotation matrix closest to ``M`` (3, 3) in the Frobenius norm."""
    U, _, Vt = np.linalg.svd(M)
    R = U @ Vt
    if np.linalg.det(R) < 0:
        R = U @ np.diag([1.0, 1.0, -1.0]) @ Vt
    return R


def rotation_from_homography(H: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Return the camera rotation R of a pure-rotation homography H = K R K^-1 (R maps camera-0 to camera-1 axes)."""
    M = np.linalg.inv(K) @ H @ K
    M = M / np.cbrt(np.linalg.det(M))  # a homography is known up to scale; a rotation has det 1
    return nearest_rotation(M)


def rotation_angle_deg(R: np.ndarray) -> float:
    """Return the angle of rotation ``R`` in degrees."""
    return float(np.rad2deg(np.arccos(np.clip((np.trace(R) - 1.0) / 2.0, -1.0, 1.0))))


def parallax_px(p0: np.ndarray, p1: np.ndarray, R: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Return per match the pixels between ``p1`` and ``p0`` moved by rotation R alone (the translation's share)."""
    H = K @ R @ np.linalg.inv(K)
    h = np.c_[p0, np.ones(len(p0))] @ H.T
    return np.linalg.norm(h[:, :2] / h[:, 2:3] - p1, axis=1)


@dataclass
class Motion:
    """The motion of the camera from frame a to frame b: x_b = R @ x_a + t (t has unit norm, or is zero)."""

    R: np.ndarray
    t: np.ndarray
    parallax_px: float  # median pixel motion left after removing the rotation
    inliers: np.ndarray  # (N,) bool, matches consistent with the motion


def relative_motion(p0: np.ndarray, p1: np.ndarray, K: np.ndarray, min_parallax_px: float) -> Motion | None:
    """Return the camera motion between matched pixels ``p0`` and ``p1`` (N, 2), or None when it cannot be told.

    Below ``min_parallax_px`` of median parallax the motion is taken as a pure rotation (from
    the homography), because an essential matrix of a nearly pure rotation is degenerate.
    """
    import cv2

    if len(p0) < 12:
        return None
    p0 = np.asarray(p0, dtype=np.float64)
    p1 = np.asarray(p1, dtype=np.float64)
    H, h_inl = cv2.findHomography(p0, p1, cv2.RANSAC, 1.0)
    if H is None:
        return None
    R_h = rotation_from_homography(H, K)
    h_inl = h_inl.ravel().astype(bool)
    par = float(np.median(parallax_px(p0[h_inl], p1[h_inl], R_h, K))) if h_inl.any() else np.inf
    if par < min_parallax_px:
        return Motion(R_h, np.zeros(3), par, h_inl)
    E, e_inl = cv2.findEssentialMat(p0, p1, K, method=cv2.RANSAC, prob=0.999, threshold=1.0)
    if E is None or E.shape != (3, 3):
        return None
    n, R, t, pose_inl = cv2.recoverPose(E, p0, p1, K, mask=e_inl.copy())
    if n < 8:
        return None
    inl = pose_inl.ravel().astype(bool)
    par = float(np.median(parallax_px(p0[inl], p1[inl], R, K)))
    return Motion(R, t.ravel() / max(float(np.linalg.norm(t)), 1e-12), par, inl)


def triangulate(p0: np.ndarray, p1: np.ndarray, R: np.ndarray, t: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Return points (N, 3) in camera a's frame seen at ``p0`` in a and ``p1`` in b, with x_b = R x_a + t."""
    import cv2

    P0 = K @ np.c_[np.eye(3), np.zeros(3)]
    P1 = K @ np.c_[R, t.reshape(3)]
    X = cv2.triangulatePoints(P0, P1, p0.T.astype(np.float64), p1.T.astype(np.float64))
    return (X[:3] / X[3]).T


def reprojection_error_px(
    X: np.ndarray, p0: np.ndarray, p1: np.ndarray, R: np.ndarray, t: np.ndarray, K: np.ndarray
) -> np.ndarray:
    """Return per point the mean pixel error of points X (N, 3) reprojected into both views."""

    def proj(Y: np.ndarray) -> np.ndarray:
        h = Y @ K.T
        return h[:, :2] / h[:, 2:3]

    return 0.5 * (np.linalg.norm(proj(X) - p0, axis=1) + np.linalg.norm(proj(X @ R.T + t.reshape(3)) - p1, axis=1))


def chain_poses(steps: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Return world->camera matrices (T, 4, 4) from per-step motions x_{k+1} = R_k x_k + t_k; frame 0 is the world."""
    E = np.tile(np.eye(4), (len(steps) + 1, 1, 1))
    for k, (R, t) in enumerate(steps):
        step = np.eye(4)
        step[:3, :3], step[:3, 3] = R, t
        E[k + 1] = step @ E[k]
    return E


def densify(
    shape: tuple[int, int], pixels: np.ndarray, depth: np.ndarray, sigma_px: float, background: np.ndarray
) -> np.ndarray:
    """Return a dense (H, W) map from sparse ``depth`` (N,) at ``pixels`` (N, 2), by normalised Gaussian smoothing.

    Each pixel is a Gaussian-weighted mean of the sparse depths near it (normalised
    convolution); far from every sample the weights vanish and the map blends into
    ``background`` (H, W).
    """
    import cv2

    H, W = shape
    num = np.zeros((H, W), np.float32)
    den = np.zeros((H, W), np.float32)
    u = np.clip(np.round(pixels[:, 0]).astype(int), 0, W - 1)
    v = np.clip(np.round(pixels[:, 1]).astype(int), 0, H - 1)
    np.add.at(num, (v, u), depth.astype(np.float32))
    np.add.at(den, (v, u), 1.0)
    num = np.asarray(cv2.GaussianBlur(num, (0, 0), sigma_px), dtype=np.float32)
    den = np.asarray(cv2.GaussianBlur(den, (0, 0), sigma_px), dtype=np.float32)
    # Where a handful of samples' tails are all there is, blend towards the background.
    weight = np.clip(den / (den.max() * 0.05 + 1e-12), 0.0, 1.0)
    mean = np.where(den > 0, num / np.maximum(den, 1e-12), 0.0)
    return (weight * mean + (1 - weight) * background).astype(np.float32)


def plane_prior_depth(shape: tuple[int, int], median_m: float, tilt: float = 0.4) -> np.ndarray:
    """Return a (H, W) depth prior: a plane ``median_m`` away at the image centre, nearer towards the bottom.

    It is what the backend writes when the footage gives no parallax: a guess shaped like a
    floor or table seen from above, not a measurement.
    """
    H, W = shape
    rows = (np.arange(H, dtype=np.float32) - H / 2.0) / (H / 2.0)
    return np.repeat((median_m * (1.0 - tilt * rows))[:, None], W, axis=1).astype(np.float32)

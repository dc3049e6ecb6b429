"""Camera geometry shared by the stages: windows, projection, rotations, crops, seeds."""

from __future__ import annotations

import hashlib

import numpy as np


def window_starts(num_frames: int, window_length: int, stride: int) -> np.ndarray:
    """Return the start frames ``range(0, T - window_length + 1, stride)`` as int64 (empty if T is short)."""
    if window_length < 1 or stride < 1:
        raise ValueError(f"window_length and stride must be >= 1, got {window_length} and {stride}")
    return np.arange(0, max(num_frames - window_length + 1, 0), stride, dtype=np.int64)


def unproject(pixels_uv: np.ndarray, depth: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Return camera-frame points (N, 3) float64 of pixels (N, 2) (u right, v down) at metric depth (N,)."""
    uv = np.asarray(pixels_uv, dtype=np.float64)
    z = np.asarray(depth, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    x = (uv[:, 0] - K[0, 2]) * z / K[0, 0]
    y = (uv[:, 1] - K[1, 2]) * z / K[1, 1]
    return np.stack([x, y, z], axis=-1)


def project_uvd(points: np.ndarray, K: np.ndarray, image_size: float) -> np.ndarray:
    """Return ``[pu/pw/size, pv/pw/size, z]`` (..., 3) float64 for camera-frame points (..., 3)."""
    p = np.asarray(points, dtype=np.float64)
    proj = p @ np.asarray(K, dtype=np.float64).T
    # A point on the camera plane projects to infinity; the caller's d > 0 test drops it.
    with np.errstate(divide="ignore", invalid="ignore"):
        u = proj[..., 0] / proj[..., 2] / image_size
        v = proj[..., 1] / proj[..., 2] / image_size
    return np.stack([u, v, p[..., 2]], axis=-1)


WINDOW_POSE_ORDERS = ("y2r", "camera")


def window_poses(extrinsics: np.ndarray, order: str = "y2r") -> np.ndarray:
    """Return a window's poses (L, 4, 4) float64 from its world->camera extrinsics (L, 4, 4).

    ``y2r``: ``inv(E_0) @ E_t``, what y2r writes and gives TAPIP3D (process_tapip3d.py:255-273)
    and what its models were trained on. ``camera``: ``E_t @ inv(E_0)``, the world->camera pose
    of step t in a world that is step 0's camera (it maps a point of camera 0 into camera t).
    The two agree when the camera does not rotate from step 0 or step 0's camera is the world.
    """
    E = np.asarray(extrinsics, dtype=np.float64)
    if order == "y2r":
        return np.linalg.inv(E[0]) @ E
    if order == "camera":
        return E @ np.linalg.inv(E[0])
    raise ValueError(f"window pose order must be one of {WINDOW_POSE_ORDERS}, got {order!r}")


def rot_6d(R: np.ndarray) -> np.ndarray:
    """Return ``[R[:,0], R[:,1]]`` (..., 6) of rotation matrices (..., 3, 3)."""
    R = np.asarray(R)
    return np.concatenate([R[..., :, 0], R[..., :, 1]], axis=-1)


def pose_9d(P: np.ndarray) -> np.ndarray:
    """Return ``[R[:,0], R[:,1], t]`` (..., 9) of 4x4 poses (..., 4, 4)."""
    P = np.asarray(P)
    return np.concatenate([rot_6d(P[..., :3, :3]), P[..., :3, 3]], axis=-1)


def square_crop(height: int, width: int) -> tuple[int, int, int]:
    """Return ``(crop_x, crop_y, side)`` of the centred square crop of side min(H, W)."""
    side = min(height, width)
    return (width - side) // 2, (height - side) // 2, side


def crop_intrinsics(K: np.ndarray, crop_x: int, crop_y: int, side: int, size: int) -> np.ndarray:
    """Return K (3, 3) of the square crop resized to ``size``, in K's own float dtype (float32 from ViPE).

    Step by step as y2r's ``transform_intrinsics`` (hgupt3/y2r dataset_scripts/create_h5_dataset.py
    L311-318): a copy, cx -= crop_x, cy -= crop_y, then rows 0 and 1 times ``size / side``, each
    step rounded to K's dtype. Computing in float64 and rounding once moves fx by one float32
    step (307.19998 vs 307.2), enough to flip the sign of u for a point on the crop's edge.
    """
    Kc = np.array(K, copy=True)
    if Kc.dtype.kind != "f":
        Kc = Kc.astype(np.float64)
    Kc[0, 2] -= crop_x
    Kc[1, 2] -= crop_y
    scale = size / side
    Kc[0, :] *= scale
    Kc[1, :] *= scale
    return Kc


def project_step(points: np.ndarray, K: np.ndarray, image_size: float) -> np.ndarray:
    """Return ``[pu/pw/size, pv/pw/size, z]`` (N, 3) of one step's points (N, 3), in their dtype.

    The very operations of y2r's ``project_to_camera_frame`` (create_h5_dataset.py L161-173),
    ``(K @ p.T).T`` then two divisions, so that float32 inputs give y2r's float32 bits; a point
    on the camera plane gives inf or NaN, which every bounds test rejects.
    """
    p = np.ascontiguousarray(points)
    proj = (K @ p.T).T
    out = np.empty(p.shape, dtype=np.result_type(proj, p))
    with np.errstate(divide="ignore", invalid="ignore"):
        out[:, 0] = proj[:, 0] / proj[:, 2] / image_size
        out[:, 1] = proj[:, 1] / proj[:, 2] / image_size
    out[:, 2] = p[:, 2]
    return out


def axis_angle_to_matrix(rotvec: np.ndarray) -> np.ndarray:
    """Return rotation matrices (..., 3, 3) of axis-angle vectors (..., 3) (Rodrigues)."""
    r = np.asarray(rotvec, dtype=np.float64)
    theta = np.linalg.norm(r, axis=-1, keepdims=True)
    axis = np.where(theta > 1e-12, r / np.where(theta > 1e-12, theta, 1.0), 0.0)
    x, y, z = axis[..., 0], axis[..., 1], axis[..., 2]
    zero = np.zeros_like(x)
    k = np.stack([zero, -z, y, z, zero, -x, -y, x, zero], axis=-1).reshape(r.shape[:-1] + (3, 3))
    s = np.sin(theta)[..., None]
    c = np.cos(theta)[..., None]
    return np.eye(3) + s * k + (1.0 - c) * (k @ k)


def matrix_to_quat(R: np.ndarray) -> np.ndarray:
    """Return the unit quaternion (w, x, y, z) of one rotation matrix (3, 3)."""
    R = np.asarray(R, dtype=np.float64)
    tr = np.trace(R)
    # Shepperd's branches keep the divisor away from zero for every rotation.
    if tr > 0:
        s = 2.0 * np.sqrt(tr + 1.0)
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    elif R[0, 0] > R[1, 1] and R[0, 0] > R[2, 2]:
        s = 2.0 * np.sqrt(1.0 + R[0, 0] - R[1, 1] - R[2, 2])
        q = [(R[2, 1] - R[1, 2]) / s, 0.25 * s, (R[0, 1] + R[1, 0]) / s, (R[0, 2] + R[2, 0]) / s]
    elif R[1, 1] > R[2, 2]:
        s = 2.0 * np.sqrt(1.0 + R[1, 1] - R[0, 0] - R[2, 2])
        q = [(R[0, 2] - R[2, 0]) / s, (R[0, 1] + R[1, 0]) / s, 0.25 * s, (R[1, 2] + R[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + R[2, 2] - R[0, 0] - R[1, 1])
        q = [(R[1, 0] - R[0, 1]) / s, (R[0, 2] + R[2, 0]) / s, (R[1, 2] + R[2, 1]) / s, 0.25 * s]
    quat = np.array(q)
    return quat / np.linalg.norm(quat)


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """Return the rotation matrix (3, 3) of a quaternion (w, x, y, z)."""
    q = np.asarray(q, dtype=np.float64)  # before the norm too: a float32 norm would round the result to float32
    w, x, y, z = q / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def slerp(R0: np.ndarray, R1: np.ndarray, alpha: float) -> np.ndarray:
    """Return the rotation (3, 3) a fraction ``alpha`` of the shortest arc from R0 to R1."""
    q0, q1 = matrix_to_quat(R0), matrix_to_quat(R1)
    dot = float(np.dot(q0, q1))
    if dot < 0.0:  # q and -q are the same rotation; take the short way round
        q1, dot = -q1, -dot
    if dot > 0.9995:
        q = q0 + alpha * (q1 - q0)
    else:
        omega = np.arccos(min(dot, 1.0))
        q = (np.sin((1 - alpha) * omega) * q0 + np.sin(alpha * omega) * q1) / np.sin(omega)
    return quat_to_matrix(q)


def content_seed(array: np.ndarray | np.integer, *extra: int) -> int:
    """Return a 63-bit seed from an array's bytes, shape and extra ints (same content, same seed)."""
    h = hashlib.blake2b(digest_size=8)
    a = np.ascontiguousarray(array)
    h.update(repr((a.dtype.str, a.shape, extra)).encode())
    h.update(a.tobytes())
    return int.from_bytes(h.digest(), "little") >> 1

"""Geometry helpers against hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.outputs.geometry import (
    axis_angle_to_matrix,
    content_seed,
    crop_intrinsics,
    matrix_to_quat,
    pose_9d,
    project_uvd,
    quat_to_matrix,
    rot_6d,
    slerp,
    square_crop,
    unproject,
    window_poses,
    window_starts,
)


def rot_z(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def test_window_starts_follow_range_and_short_videos_have_none() -> None:
    assert window_starts(12, 10, 1).tolist() == [0, 1, 2]
    assert window_starts(25, 10, 5).tolist() == [0, 5, 10, 15]
    assert window_starts(10, 10, 1).tolist() == [0]
    assert window_starts(9, 10, 1).tolist() == []
    assert window_starts(0, 10, 1).dtype == np.int64


def test_rot_6d_is_first_two_columns_in_column_order() -> None:
    R = np.arange(9.0).reshape(3, 3)
    assert rot_6d(R).tolist() == [0.0, 3.0, 6.0, 1.0, 4.0, 7.0]  # [r00, r10, r20, r01, r11, r21]


def test_pose_9d_row_order() -> None:
    P = np.eye(4)
    P[:3, :3] = rot_z(np.pi / 2)
    P[:3, 3] = [0.1, 0.2, 0.3]
    np.testing.assert_allclose(pose_9d(P), [0, 1, 0, -1, 0, 0, 0.1, 0.2, 0.3], atol=1e-15)


def test_window_poses_are_inv_first_times_each() -> None:
    E = np.stack([np.eye(4)] * 3)
    E[1, :3, 3] = [1.0, 0.0, 0.0]
    E[2, :3, :3] = rot_z(0.3)
    E[0, :3, 3] = [0.0, 2.0, 0.0]
    P = window_poses(E)
    np.testing.assert_allclose(P[0], np.eye(4), atol=1e-15)
    for t in range(3):
        np.testing.assert_allclose(P[t], np.linalg.inv(E[0]) @ E[t])
    assert P[1, :3, 3].tolist() == pytest.approx([1.0, -2.0, 0.0])


def test_square_crop_and_crop_intrinsics_for_512x384() -> None:
    assert square_crop(384, 512) == (64, 0, 384)
    assert square_crop(512, 384) == (0, 64, 384)
    K = np.array([[300.0, 0.0, 256.0], [0.0, 310.0, 192.0], [0.0, 0.0, 1.0]])
    Kc = crop_intrinsics(K, 64, 0, 384, 256)
    np.testing.assert_allclose(Kc, [[200.0, 0.0, 128.0], [0.0, 310 * 2 / 3, 128.0], [0.0, 0.0, 1.0]])


def test_project_and_unproject_round_trip() -> None:
    K = np.array([[200.0, 0.0, 128.0], [0.0, 200.0, 128.0], [0.0, 0.0, 1.0]])
    pixels = np.array([[0.0, 0.0], [128.0, 128.0], [255.0, 10.0]])
    depth = np.array([0.5, 1.0, 2.0])
    points = unproject(pixels, depth, K)
    assert points[1].tolist() == [0.0, 0.0, 1.0]
    uvd = project_uvd(points, K, 256)
    np.testing.assert_allclose(uvd[:, :2] * 256, pixels, atol=1e-12)
    np.testing.assert_allclose(uvd[:, 2], depth)


def test_axis_angle_and_quaternions_agree() -> None:
    R = axis_angle_to_matrix(np.array([0.0, 0.0, 0.4]))
    np.testing.assert_allclose(R, rot_z(0.4), atol=1e-15)
    np.testing.assert_allclose(axis_angle_to_matrix(np.zeros(3)), np.eye(3))
    rng = np.random.default_rng(0)
    for rv in rng.normal(size=(20, 3)):
        R = axis_angle_to_matrix(rv)
        np.testing.assert_allclose(quat_to_matrix(matrix_to_quat(R)), R, atol=1e-12)


def test_slerp_walks_the_short_arc_at_constant_speed() -> None:
    R0, R1 = rot_z(0.2), rot_z(1.0)
    np.testing.assert_allclose(slerp(R0, R1, 0.0), R0, atol=1e-12)
    np.testing.assert_allclose(slerp(R0, R1, 1.0), R1, atol=1e-12)
    np.testing.assert_allclose(slerp(R0, R1, 0.25), rot_z(0.4), atol=1e-12)
    # 350 degrees apart one way is 10 degrees the other: the midpoint is 5 degrees past R0.
    np.testing.assert_allclose(slerp(rot_z(0.0), rot_z(np.deg2rad(-10)), 0.5), rot_z(np.deg2rad(-5)), atol=1e-12)


def test_content_seed_depends_on_content_shape_and_extras() -> None:
    a = np.zeros((2, 3), np.uint8)
    assert content_seed(a) == content_seed(a.copy())
    assert content_seed(a) != content_seed(a.reshape(3, 2))
    assert content_seed(a, 1) != content_seed(a, 2)
    b = a.copy()
    b[0, 0] = 1
    assert content_seed(a) != content_seed(b)
    assert 0 <= content_seed(a) < 2**63

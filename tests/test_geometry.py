"""Geometry helpers against hand-computed answers (and y2r's intrinsics transform, tests/y2r_oracle.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tasks.outputs.geometry import (
    axis_angle_to_matrix,
    content_seed,
    crop_intrinsics,
    matrix_to_quat,
    pose_9d,
    project_step,
    project_uvd,
    quat_to_matrix,
    rot_6d,
    slerp,
    square_crop,
    unproject,
    window_poses,
    window_starts,
)
from tests import y2r_oracle


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


def test_window_starts_refuses_a_zero_length_or_stride_and_takes_one() -> None:
    for length, stride in ((0, 1), (1, 0), (0, 0)):
        with pytest.raises(ValueError, match=f"got {length} and {stride}"):
            window_starts(10, length, stride)
    assert window_starts(3, 1, 1).tolist() == [0, 1, 2]


def test_unproject_uses_each_axis_own_principal_point() -> None:
    K = np.array([[300.0, 0.0, 250.0], [0.0, 320.0, 180.0], [0.0, 0.0, 1.0]])
    points = unproject(np.array([[250.0, 180.0], [550.0, 500.0]]), np.array([2.0, 1.0]), K)
    np.testing.assert_allclose(points, [[0.0, 0.0, 2.0], [1.0, 1.0, 1.0]], atol=1e-15)


def test_project_uvd_keeps_the_leading_axes_of_a_window() -> None:
    K = np.array([[200.0, 0.0, 128.0], [0.0, 200.0, 128.0], [0.0, 0.0, 1.0]])
    points = np.random.default_rng(3).uniform([-0.5, -0.5, 0.5], [0.5, 0.5, 2.0], (4, 5, 3))  # (L, P, 3)
    uvd = project_uvd(points, K, 256)
    assert uvd.shape == (4, 5, 3)
    np.testing.assert_allclose(uvd[2, 3], project_uvd(points[2, 3:4], K, 256)[0], rtol=1e-15)
    np.testing.assert_allclose(uvd[..., 2], points[..., 2])


def test_a_point_on_the_camera_plane_projects_to_a_non_finite_uv_without_warnings() -> None:
    """Every window test drops it; numpy's division warnings would fill a worker's log once per window."""
    K = np.array([[200.0, 0.0, 128.0], [0.0, 200.0, 128.0], [0.0, 0.0, 1.0]], np.float32)
    points = np.array([[0.2, 0.1, 0.0], [0.0, 0.0, 0.0]], np.float32)  # divide by zero; zero by zero
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for uvd in (project_uvd(points, K, 256), project_step(points, K, 256)):
            assert not np.isfinite(uvd[:, :2]).any() and uvd[:, 2].tolist() == [0.0, 0.0]


def test_project_step_computes_in_the_wider_of_the_points_and_ks_dtypes() -> None:
    K32 = np.array([[200.3, 0.0, 128.7], [0.0, 199.1, 127.2], [0.0, 0.0, 1.0]], np.float32)
    points = np.random.default_rng(5).uniform([-0.5, -0.5, 0.5], [0.5, 0.5, 2.0], (50, 3)).astype(np.float32)
    assert project_step(points, K32, 256).dtype == np.float32  # y2r's float32 bits (tests/test_windows.py)
    wide = project_step(points, K32.astype(np.float64), 256)
    assert wide.dtype == np.float64
    np.testing.assert_array_equal(wide, project_uvd(points, K32, 256))


def test_window_poses_are_float64_from_float32_extrinsics_and_refuse_an_unknown_order() -> None:
    E = np.stack([np.eye(4)] * 2)
    E[0, :3, :3], E[0, :3, 3] = rot_z(0.3), [0.1, 0.2, 0.3]
    E[1, :3, :3], E[1, :3, 3] = rot_z(0.7), [0.4, 0.1, 0.9]
    E32 = E.astype(np.float32)
    P = window_poses(E32)
    assert P.dtype == np.float64
    np.testing.assert_array_equal(P, np.linalg.inv(E32[0].astype(np.float64)) @ E32.astype(np.float64))
    with pytest.raises(ValueError, match="'world'"):
        window_poses(E, "world")


def test_crop_intrinsics_keep_ks_float_dtype_and_shift_by_the_crops_corner() -> None:
    """ViPE's float32 K stays float32, step by step as y2r (tests/y2r_oracle.py); integers become float64."""
    K = np.array([[307.2, 0.0, 192.5], [0.0, 311.3, 256.5], [0.0, 0.0, 1.0]], np.float32)
    crop_x, crop_y, side = square_crop(512, 384)  # portrait: the crop starts 64 rows down
    Kc = crop_intrinsics(K, crop_x, crop_y, side, 256)
    assert Kc.dtype == np.float32
    np.testing.assert_array_equal(Kc, y2r_oracle.transform_intrinsics(K, crop_x, crop_y, side, 256))
    np.testing.assert_allclose(Kc[1, 2], (256.5 - 64) * 256 / 384, rtol=1e-6)
    assert Kc[2].tolist() == [0.0, 0.0, 1.0]
    Ki = crop_intrinsics(np.array([[300, 0, 192], [0, 300, 256], [0, 0, 1]]), crop_x, crop_y, side, 256)
    assert Ki.dtype == np.float64
    np.testing.assert_allclose(Ki, [[200.0, 0.0, 128.0], [0.0, 200.0, 128.0], [0.0, 0.0, 1.0]])


def test_rotations_from_float32_inputs_are_computed_in_float64() -> None:
    """MANO's and WiLoR's outputs are float32: the conversions do not round to float32 on the way."""
    rotvec = np.array([0.3, -1.1, 0.7], np.float32)
    R = axis_angle_to_matrix(rotvec)
    np.testing.assert_allclose(R, axis_angle_to_matrix(rotvec.astype(np.float64)), rtol=0, atol=1e-15)
    R32 = R.astype(np.float32)  # orthonormal to float32's precision only
    np.testing.assert_array_equal(matrix_to_quat(R32), matrix_to_quat(R32.astype(np.float64)))
    assert abs(np.linalg.norm(matrix_to_quat(R32)) - 1) < 1e-15  # still a unit quaternion (slerp needs one)
    q = matrix_to_quat(R).astype(np.float32)
    np.testing.assert_array_equal(quat_to_matrix(q), quat_to_matrix(q.astype(np.float64)))


def test_axis_angle_converts_a_batch_as_one_at_a_time() -> None:
    rotvecs = np.random.default_rng(2).normal(size=(4, 6, 3))
    rotvecs[0, 0] = 0.0
    R = axis_angle_to_matrix(rotvecs)
    assert R.shape == (4, 6, 3, 3)
    for i, j in np.ndindex(4, 6):
        np.testing.assert_allclose(R[i, j], axis_angle_to_matrix(rotvecs[i, j]), atol=1e-15)
    np.testing.assert_array_equal(R[0, 0], np.eye(3))


def test_matrix_to_quat_takes_every_branch_right_half_turns_included() -> None:
    """Near a half turn the trace is negative and the largest diagonal entry picks the formula: x, y or z.

    The axes tilted by 1e-7 towards x are where a formula picked by another rule loses ten digits."""
    tilted = ([1, 2, 3], [-3, 1, 0.5], [0.5, -3, 1], [1e-7, 1, 0], [1e-7, 0, 1])
    axes = [np.eye(3)[i] for i in range(3)] + [np.array(a) / np.linalg.norm(a) for a in tilted]
    angles = [0.0, 0.4, 2.0, np.deg2rad(170), np.pi]
    for axis in axes:
        for angle in angles:
            R = axis_angle_to_matrix(axis * angle)
            want = np.concatenate([[np.cos(angle / 2)], np.sin(angle / 2) * axis])
            q = matrix_to_quat(R)
            assert min(np.abs(q - want).max(), np.abs(q + want).max()) < 1e-12, (axis, angle, q)
            np.testing.assert_allclose(quat_to_matrix(q), R, atol=1e-12)


def test_quat_to_matrix_normalises_its_quaternion() -> None:
    np.testing.assert_allclose(quat_to_matrix(np.array([2.0, 0.0, 0.0, 0.0])), np.eye(3), atol=1e-15)
    q = 3.0 * matrix_to_quat(rot_z(0.5))
    np.testing.assert_allclose(quat_to_matrix(q), rot_z(0.5), atol=1e-15)


def test_slerp_takes_the_short_way_across_a_half_turn_and_is_exact_for_equal_and_close_rotations() -> None:
    # 100 degrees one way and 100 the other: 160 degrees apart the short way, across the half turn.
    np.testing.assert_allclose(slerp(rot_z(np.deg2rad(100)), rot_z(np.deg2rad(-100)), 0.5), rot_z(np.pi), atol=1e-12)
    np.testing.assert_allclose(
        slerp(rot_z(np.deg2rad(100)), rot_z(np.deg2rad(-100)), 0.25), rot_z(np.deg2rad(140)), atol=1e-12
    )
    np.testing.assert_allclose(slerp(rot_z(0.2), rot_z(0.2), 0.3), rot_z(0.2), atol=1e-15)
    np.testing.assert_allclose(slerp(rot_z(0.2), rot_z(0.21), 0.5), rot_z(0.205), atol=1e-9)  # linear, close


def test_content_seeds_are_63_bit() -> None:
    seeds = [content_seed(np.full(3, i, np.int64)) for i in range(32)]
    assert all(0 <= s < 2**63 for s in seeds) and len(set(seeds)) == 32
    assert max(seeds) >= 2**62  # all 63 bits in use (the chance that 32 seeds miss the top one: 2**-32)

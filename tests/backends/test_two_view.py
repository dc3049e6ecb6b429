"""The classical camera backend: two-view geometry on pure data, a known rotation on a real image, fallback on sheep."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.backends import two_view as tv
from tasks.backends.classical_depth import ClassicalDepth, fallback_reason
from tasks.outputs.geometry import axis_angle_to_matrix
from tests.backends.real_clips import frames

K = tv.k_matrix(tv.fov_intrinsics(512, 384, 60.0))


def test_fov_intrinsics_put_the_principal_point_at_the_centre_and_widen_with_the_angle():
    fx, fy, cx, cy = tv.fov_intrinsics(512, 384, 60.0)
    assert (cx, cy) == (256.0, 192.0) and fx == fy
    assert np.isclose(np.rad2deg(2 * np.arctan(256 / fx)), 60.0)
    assert tv.fov_intrinsics(512, 384, 90.0)[0] < fx
    with pytest.raises(ValueError, match="fov_degrees"):
        tv.fov_intrinsics(512, 384, 0.0)


def test_rotation_from_homography_inverts_k_r_k_inverse_at_any_scale():
    R = axis_angle_to_matrix(np.array([0.02, -0.05, 0.01]))
    H = 3.7 * K @ R @ np.linalg.inv(K)
    assert np.allclose(tv.rotation_from_homography(H, K), R, atol=1e-9)


def test_relative_motion_tells_translation_from_rotation_on_exact_matches():
    rng = np.random.default_rng(0)
    X = np.c_[rng.uniform(-1, 1, 200), rng.uniform(-0.7, 0.7, 200), rng.uniform(1.0, 3.0, 200)]
    R = axis_angle_to_matrix(np.array([0.0, 0.03, 0.0]))
    t = np.array([0.1, 0.0, 0.02])

    def px(P):
        h = P @ K.T
        return h[:, :2] / h[:, 2:3]

    moved = tv.relative_motion(px(X), px(X @ R.T + t), K, min_parallax_px=0.7)
    assert moved.parallax_px > 5 and np.allclose(moved.R, R, atol=1e-3)
    assert np.allclose(moved.t, t / np.linalg.norm(t), atol=1e-2)
    turned = tv.relative_motion(px(X), px(X @ R.T), K, min_parallax_px=0.7)
    assert turned.parallax_px < 0.7 and np.allclose(turned.R, R, atol=1e-4) and not turned.t.any()


def test_chained_poses_compose_each_step_after_the_previous():
    R1, R2 = axis_angle_to_matrix(np.array([0.1, 0, 0])), axis_angle_to_matrix(np.array([0, 0.2, 0]))
    E = tv.chain_poses([(R1, np.array([1.0, 0, 0])), (R2, np.zeros(3))])
    assert np.allclose(E[0], np.eye(4)) and np.allclose(E[2][:3, :3], R2 @ R1)
    assert np.allclose(E[2][:3, 3], R2 @ [1.0, 0, 0])


def test_densify_keeps_samples_near_their_value_and_falls_back_to_the_background_far_away():
    background = np.full((100, 100), 2.0, np.float32)
    pixels = np.array([[20.0, 20.0], [22.0, 21.0], [21.0, 23.0]])
    dense = tv.densify((100, 100), pixels, np.array([1.0, 1.0, 1.0]), 3.0, background)
    assert abs(dense[21, 21] - 1.0) < 0.05 and abs(dense[90, 90] - 2.0) < 1e-6


def test_fallback_reason_names_the_measured_motion():
    assert "0.20 px < 1 px" in fallback_reason(50, 49, 0.2, 1.0)
    assert "3 of 49" in fallback_reason(50, 3, 5.0, 1.0)
    assert fallback_reason(50, 45, 5.0, 1.0) is None


def test_camera_backend_recovers_a_known_rotation_on_frames_rendered_from_a_real_image():
    import cv2

    image = frames("dog.mp4", 1)[0]
    axis = np.array([0.3, 1.0, 0.1]) / np.linalg.norm([0.3, 1.0, 0.1])
    step = np.deg2rad(1.5)  # about 12 px of image motion per frame at this field of view
    rotations = [axis_angle_to_matrix(axis * step * t) for t in range(6)]
    # A camera that only turns sees image_t(K R_t K^-1 p) = image_0(p).
    rendered = np.stack([cv2.warpPerspective(image, K @ R @ np.linalg.inv(K), (512, 384)) for R in rotations])
    out = ClassicalDepth(fov_degrees=60.0).infer(rendered)
    assert out["notes"]["camera"] == "two-view"
    world_to_camera = np.linalg.inv(out["cam_to_world"])
    for t, R in enumerate(rotations):
        error = tv.rotation_angle_deg(world_to_camera[t, :3, :3] @ R.T)
        assert error < 0.1, f"frame {t}: rotation off by {error:.3f} deg"
    assert np.allclose(world_to_camera[:, :3, 3], 0.0, atol=1e-6)  # no parallax: no translation


def test_camera_backend_falls_back_with_its_reason_on_sheep():
    clip = frames("sheep.mp4", 30)
    out = ClassicalDepth().infer(clip)
    notes = out["notes"]
    assert notes["camera"] == "fallback" and "barely moves" in notes["reason"] and notes["frames_posed"] == 0
    assert np.allclose(out["cam_to_world"], np.eye(4))
    assert notes["depth"] == "plane-prior" and np.all(out["depths"] > 0)

"""Landmarks to the hands contract: side labels, palm frame, wrist by depth (y2r's rule) and by PnP."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.backends.hand_geometry import (
    WRIST_DEPTH_OFFSET_M,
    depth_at,
    hand_in_camera,
    palm_rotation,
    side_of,
    wrist_from_depth,
    wrist_from_pnp,
)
from tasks.outputs.geometry import axis_angle_to_matrix

K = np.array([[440.0, 0, 256], [0, 440.0, 192], [0, 0, 1]])


def right_hand() -> np.ndarray:
    """21 landmarks (m) of an open right hand, palm towards -z, fingers along -y, thumb towards -x."""
    joints = [np.zeros(3)]
    for finger in range(5):
        base = np.array([-0.04 + 0.02 * finger, -0.08 if finger else -0.03, 0.0])
        direction = np.array([-0.5, -0.5, 0.0]) if finger == 0 else np.array([0.0, -1.0, 0.0])
        joints += [base + 0.025 * j * direction / np.linalg.norm(direction) for j in range(4)]
    return np.array(joints)


def project(P: np.ndarray) -> np.ndarray:
    h = P @ K.T
    return h[:, :2] / h[:, 2:3]


def test_mediapipe_labels_are_swapped_for_a_camera_image_and_kept_for_a_mirrored_one():
    assert side_of("Left") == "right" and side_of("Right") == "left"
    assert side_of("Left", mirrored_input=True) == "left"
    with pytest.raises(ValueError, match="'Left' or 'Right'"):
        side_of("Up")


def test_palm_frame_is_a_rotation_that_turns_with_the_hand_for_both_sides():
    hand = right_hand()
    R0 = palm_rotation(hand, "right")
    assert np.allclose(R0 @ R0.T, np.eye(3), atol=1e-9) and np.isclose(np.linalg.det(R0), 1.0)
    turn = axis_angle_to_matrix(np.array([0.3, -0.4, 0.2]))
    assert np.allclose(palm_rotation(hand @ turn.T, "right"), turn @ R0, atol=1e-9)
    left = hand * [-1, 1, 1]  # a mirror image is the other hand
    R_left = palm_rotation(left, "left")
    assert np.isclose(np.linalg.det(R_left), 1.0)
    assert np.allclose(R_left[:, 2], R0[:, 2] * [-1, 1, 1], atol=1e-9)  # z stays on the same side of the palm


def test_wrist_from_depth_adds_two_centimetres_and_searches_near_a_hole():
    depth = np.full((384, 512), 0.8, np.float32)
    pos = wrist_from_depth(np.array([300.0, 200.0]), depth, K)
    assert np.isclose(pos[2], 0.8 + WRIST_DEPTH_OFFSET_M)
    assert np.allclose(project(pos[None])[0], [300.0, 200.0])
    depth[195:206, 295:306] = 0.0  # a hole around the wrist
    assert depth_at(depth, 300, 200) == pytest.approx(0.8)
    assert wrist_from_depth(np.array([300.0, 200.0]), np.zeros((384, 512), np.float32), K) is None


def test_pnp_recovers_a_known_hand_pose_from_its_pixels():
    world = right_hand() - right_hand().mean(axis=0)  # MediaPipe's origin is the hand's centre
    R = axis_angle_to_matrix(np.array([0.4, 0.2, -0.3]))
    wrist_true = np.array([0.1, 0.05, 0.6])
    camera = (world - world[0]) @ R.T + wrist_true
    R_fit, wrist = wrist_from_pnp(world, project(camera), K)
    assert np.allclose(wrist, wrist_true, atol=1e-6) and np.allclose(R_fit, R, atol=1e-6)


def test_hand_in_camera_places_joints_by_either_rule_and_refuses_a_missing_depth():
    world = right_hand()
    camera = world + [0.0, 0.0, 0.7]
    pixels = project(camera)
    pose, joints = hand_in_camera(world, pixels, K, "right", None, "pnp")
    assert np.allclose(joints, camera, atol=1e-6) and np.allclose(pose[:3, 3], camera[0], atol=1e-6)
    depth = np.full((384, 512), 0.7 - WRIST_DEPTH_OFFSET_M, np.float32)
    pose, joints = hand_in_camera(world, pixels, K, "right", depth, "depth")
    assert np.allclose(pose[:3, 3], camera[0], atol=1e-3) and np.allclose(joints, camera, atol=1e-3)
    with pytest.raises(ValueError, match="needs the depth"):
        hand_in_camera(world, pixels, K, "right", None, "depth")

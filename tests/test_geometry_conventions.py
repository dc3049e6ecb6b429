"""y2r's two geometry conventions on scenes of known geometry: ours match y2r by default, "camera" is correct."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.backends.convert_tracks import tapip3d_window_inputs
from tasks.backends.convert_wilor import MIRROR_X, mirror_left, place_hand
from tasks.outputs.geometry import window_poses
from tasks.stages.tracks import TracksStage


def rot(axis: str, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    i, j = {"x": (1, 2), "y": (2, 0), "z": (0, 1)}[axis]
    R = np.eye(3)
    R[i, i], R[i, j], R[j, i], R[j, j] = c, -s, s, c
    return R


def rotating_camera(T: int) -> np.ndarray:
    """World->camera extrinsics (T, 4, 4) of a camera that pans and tilts as it moves (the world is not camera 0)."""
    E = np.tile(np.eye(4), (T, 1, 1))
    for t in range(T):
        E[t, :3, :3] = rot("y", 0.3 + 0.08 * t) @ rot("x", 0.05 * t)
        E[t, :3, 3] = [0.1 * t, -0.02 * t, 0.5 + 0.03 * t]
    return E


def to_cam(E: np.ndarray, X: np.ndarray) -> np.ndarray:
    return X @ E[:3, :3].T + E[:3, 3]


def test_y2rs_window_pose_does_not_map_the_first_camera_into_later_ones():
    E = rotating_camera(12)
    X = np.random.default_rng(0).uniform(-1, 1, (50, 3)) + [0, 0, 3]  # a static scene
    s, L = 2, 10
    win = E[s : s + L]
    x_s = to_cam(win[0], X)
    y2r, camera = window_poses(win, "y2r"), window_poses(win, "camera")
    np.testing.assert_allclose(window_poses(win), y2r)  # y2r's is the default
    for t in range(L):
        np.testing.assert_allclose(to_cam(camera[t], x_s), to_cam(win[t], X), atol=1e-9)  # correct at every step
    # y2r's pose used as TAPIP3D's world->camera (world = camera s) misplaces the scene: by centimetres
    # after one step, by tens of centimetres at the window's end.
    errors = [np.abs(to_cam(y2r[t], x_s) - to_cam(win[t], X)).max() for t in range(1, L)]
    assert min(errors) > 0.02 and errors[-1] > 0.2
    # Both agree when the camera keeps its orientation (a pure translation).
    still = np.tile(np.eye(4), (L, 1, 1))
    still[:, :3, 3] = np.arange(L)[:, None] * [0.1, 0.0, 0.02]
    np.testing.assert_allclose(window_poses(still, "y2r"), window_poses(still, "camera"), atol=1e-12)
    # TAPIP3D's adapter gives it y2r's poses from the video's extrinsics, and the correct ones from "camera"'s.
    np.testing.assert_allclose(tapip3d_window_inputs(np.zeros((1, 3)), win)[1], y2r, atol=1e-6)
    np.testing.assert_allclose(tapip3d_window_inputs(np.zeros((1, 3)), camera)[1], camera, atol=1e-6)


class Recorder:
    """A tracks backend that records the extrinsics it is given and keeps every query in place."""

    peak_memory_bytes = 0
    chunk_scale = 1.0

    def __init__(self) -> None:
        self.extrinsics: list[np.ndarray] = []

    def track(self, frames, queries, depths, intrinsics, extrinsics, query_pixels=None, masks=None):
        self.extrinsics.append(np.asarray(extrinsics, dtype=np.float64))
        return np.repeat(np.asarray(queries, np.float32)[None], len(frames), axis=0)


@pytest.mark.parametrize("order", ["y2r", "camera"])
def test_tracks_stage_writes_and_passes_the_chosen_window_poses(order):
    T = 12
    E = rotating_camera(T)
    K = np.array([[300.0, 0, 16], [0, 300, 12], [0, 0, 1]])
    inputs = {
        "frames": np.zeros((T, 24, 32, 3), np.uint8),
        "depths": np.ones((T, 24, 32), np.float32),
        "intrinsics": np.tile(K, (T, 1, 1)),
        "extrinsics": E.astype(np.float32),
    }
    stage = TracksStage(window_pose_order=order, target_points=8)
    stage.model = Recorder()
    out = stage.run(inputs)
    for w in (0, 2):
        expected = window_poses(E[w : w + 10], order)
        np.testing.assert_allclose(out["window_poses"][w], expected, atol=1e-5)
        given = stage.model.extrinsics[w]
        np.testing.assert_allclose(given, E[w : w + 10] if order == "y2r" else expected, atol=1e-5)
    with pytest.raises(ValueError, match="window_pose_order"):
        TracksStage(window_pose_order="world")


# A hand's joints in MANO's canonical pose (wrist at the origin), and WiLoR's outputs for a hand of known pose.
CANONICAL = np.random.default_rng(1).normal(0, 0.04, (21, 3))
CANONICAL[0] = 0


def test_y2r_rotates_manos_joints_a_second_time():
    R = rot("z", 0.7) @ rot("x", -0.4)
    wrist = np.array([0.1, 0.05, 0.6])
    truth = CANONICAL @ R.T + wrist  # the right hand in the camera frame
    keypoints = CANONICAL @ R.T  # what MANO returns to WiLoR: already rotated by the global orient
    pose, joints = place_hand(R, keypoints, wrist)  # y2r's (the default)
    np.testing.assert_allclose(pose[:3, :3], R)
    np.testing.assert_allclose(joints, CANONICAL @ (R @ R).T + wrist, atol=1e-12)  # R applied twice
    assert np.abs(joints - truth).max() > 0.01
    pose, joints = place_hand(R, keypoints, wrist, 1.0, "camera")
    np.testing.assert_allclose(joints, truth, atol=1e-12)
    np.testing.assert_allclose(pose[:3, :3], R)


def test_camera_frame_mirrors_a_left_hands_rotation():
    R_left = rot("y", 0.5) @ rot("z", -0.3)  # the left hand's orientation in the camera
    wrist = np.array([-0.1, 0.0, 0.5])
    left_canonical = CANONICAL @ MIRROR_X  # a left hand is a mirrored right hand
    truth = left_canonical @ R_left.T + wrist
    # WiLoR sees the flipped crop: a right hand whose orientation is M R M, joints (M R M) J.
    R_seen = MIRROR_X @ R_left @ MIRROR_X
    keypoints = mirror_left(CANONICAL @ R_seen.T, 0.0)  # the adapter mirrors x back, as y2r does
    pose, joints = place_hand(R_seen, keypoints, wrist, 0.0, "camera")
    np.testing.assert_allclose(joints, truth, atol=1e-12)
    np.testing.assert_allclose(pose[:3, :3], R_left, atol=1e-12)
    pose, joints = place_hand(R_seen, keypoints, wrist, 0.0)  # y2r's: the flipped hand's rotation, applied again
    np.testing.assert_allclose(pose[:3, :3], R_seen)
    assert np.abs(joints - truth).max() > 0.01
    with pytest.raises(ValueError, match="hand frame"):
        place_hand(R_seen, keypoints, wrist, 0.0, "world")

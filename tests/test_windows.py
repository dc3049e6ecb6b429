"""y2r's per-window rules (tasks.outputs.windows) against tests/y2r_oracle.py, on the cases the real runs rarely hit:
points exactly on the crop's edges, leaving through each side, on the camera plane; depths of every kind; float64
inputs from a backend, which must still give y2r's float32 bits; a camera that does not sit at z = 1.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tasks.outputs.geometry import square_crop
from tasks.outputs.windows import clip_depth, frame_pixels, hand_window, track_window, track_window_2d
from tests import y2r_oracle

SIZE, DEPTH_MIN, DEPTH_MAX = 256, 0.1, 2.5
# The crop's K: u = x / z + 0.5 and v = y / z + 0.5 exactly, so x = -0.5 and 0.5 land on the edges u = 0 and 1.
K_EDGE = np.array([[256.0, 0.0, 128.0], [0.0, 256.0, 128.0], [0.0, 0.0, 1.0]], np.float32)


def rot_z(a: float) -> np.ndarray:
    return np.array([[np.cos(a), -np.sin(a), 0.0], [np.sin(a), np.cos(a), 0.0], [0.0, 0.0, 1.0]])


def assert_identical(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Same dtype, shape and bits (NaN where NaN)."""
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (ours.dtype, ours.shape, theirs.dtype)
    np.testing.assert_array_equal(ours, theirs)


def test_depth_of_every_kind_is_clipped_as_y2r_clips_it() -> None:
    # ViPE's float16: 0.1 in float16 is 0.09998, below depth_min once in float32, as y2r converts it first.
    values = [np.nan, np.inf, -np.inf, -1.0, 0.0, 0.05, 0.1, 1.5, 2.5, 3.0, 60000.0]
    depth = np.array([values, values[::-1]], np.float16)
    ours = clip_depth(depth, DEPTH_MIN, DEPTH_MAX)
    assert_identical(ours, y2r_oracle.clip_depth(depth.astype(np.float32), DEPTH_MIN, DEPTH_MAX).astype(np.float32))
    assert ours[0].tolist()[:7] == [0.0, 0.0, 0.0, -1.0, 0.0, np.float32(0.1), np.float32(0.1)]
    assert ours[0, -1] == np.float32(DEPTH_MAX)


def edge_points() -> np.ndarray:
    """(3 steps, 12 points) in the camera: 0-4 stay in view (centre, the four edges), 5-9 leave, 10-11 clip."""
    t = np.arange(3, dtype=np.float64)[:, None]
    zero, one = np.zeros_like(t), np.ones_like(t)
    points = [
        (0.1 * t, 0.05 * t, one),  # 0: moves, in view
        (-0.5 * one, 0.1 * t, one),  # 1: on the left edge, u = 0
        (0.5 * one, -0.1 * t, one),  # 2: on the right edge, u = 1
        (0.1 * t, -0.5 * one, one),  # 3: on the top edge, v = 0
        (-0.1 * t, 0.5 * one, one),  # 4: on the bottom edge, v = 1
        (-0.3 * t, zero, one),  # 5: leaves through the left side at step 2, v stays 0.5
        (zero, -0.3 * t, one),  # 6: leaves through the top at step 2, u stays 0.5
        (zero, 0.45 * t, one),  # 7: v = 1.4 at step 2
        (0.3 * t, zero, one),  # 8: u = 1.1 at step 2
        (zero, zero, 1.0 - t),  # 9: on the camera plane at step 1, behind it at step 2
        (zero, 0.1 * t, 3.0 * one),  # 10: beyond depth_max: its query depth is clipped, its displacements not
        (0.01 * t, zero, 0.05 + 0.01 * t),  # 11: nearer than depth_min
    ]
    return np.stack([np.concatenate(p, axis=-1) for p in points], axis=1)


def test_a_window_keeps_the_points_y2r_keeps_edges_included() -> None:
    points = edge_points()
    query, disp = track_window(points, K_EDGE, SIZE, DEPTH_MIN, DEPTH_MAX)
    want_query, want_disp = y2r_oracle.window_3d(points.astype(np.float32), K_EDGE, SIZE, DEPTH_MIN, DEPTH_MAX)
    assert_identical(query, want_query)
    assert_identical(disp, want_disp)
    assert query.shape == (7, 3)  # 0-4, 10, 11: the edges are inside, every point that leaves is dropped
    np.testing.assert_allclose(query[:, 2], [1, 1, 1, 1, 1, DEPTH_MAX, DEPTH_MIN], rtol=1e-6)


def test_float64_points_and_intrinsics_give_y2rs_float32_bits() -> None:
    """A backend may hand over float64: every window rule still computes in float32, as y2r's writer does."""
    rng = np.random.default_rng(7)
    points = np.concatenate([edge_points(), rng.uniform([-0.4, -0.4, 0.5], [0.4, 0.4, 2.0], (3, 200, 3))], axis=1)
    K = K_EDGE.astype(np.float64) * [[1.37, 1, 1.11], [1, 1.29, 0.93], [1, 1, 1]]
    query, disp = track_window(points, K.astype(np.float32), SIZE, DEPTH_MIN, DEPTH_MAX)
    want = y2r_oracle.window_3d(points.astype(np.float32), K.astype(np.float32), SIZE, DEPTH_MIN, DEPTH_MAX)
    assert_identical(query, want[0])
    assert_identical(disp, want[1])
    assert_identical(frame_pixels(points, K), y2r_oracle.frame_pixels(points.astype(np.float32), K))


def test_a_point_on_or_behind_the_camera_plane_has_no_pixel() -> None:
    points = np.array([[[0.3, 0.2, 0.0], [0.0, 0.0, 0.0], [0.3, 0.2, -1.0], [0.3, 0.2, 1.0]]], np.float32)
    pixels = frame_pixels(points, K_EDGE)
    assert pixels.dtype == np.float32
    assert np.isnan(pixels[0, :3]).all()  # NaN, never inf: the crop test drops it at every step
    np.testing.assert_allclose(pixels[0, 3], [256 * 0.3 + 128, 256 * 0.2 + 128])


def test_pixel_tracks_keep_what_y2rs_2d_rule_keeps_in_a_portrait_crop() -> None:
    """A portrait frame (W 384, H 512): the crop starts at y = 64, so the vertical shift matters."""
    crop_x, crop_y, side = square_crop(512, 384)
    assert (crop_x, crop_y, side) == (0, 64, 384)
    t = np.arange(4, dtype=np.float64)[:, None]
    one = np.ones_like(t)
    tracks = [
        (100 + 3 * t, 200 + 2 * t),  # moves, inside
        (0.0 * one, 100 + t),  # on the left edge, x - crop_x = 0: inside
        (0.5 * one, 150 + t),  # half a pixel from it: inside
        (383.9 * one, 300 - t),  # just inside the right edge
        (384.0 - t, 250 * one),  # on the right edge (x - crop_x = side: outside) at step 0 only
        (200 * one, 64.0 + 0 * t),  # on the top edge, y - crop_y = 0: inside
        (210 * one, 64.5 + t),  # half a pixel below it: inside
        (220 * one, 64.0 + 384 - t),  # on the bottom edge at step 0 only
        (-0.1 - t, 300 * one),  # left of the crop, its y inside
        (50 * one, 63.9 - t),  # above the crop, its x inside
        (60 + t, 100 + 120 * t),  # leaves through the bottom at step 3
        (np.nan * one, 100 * one),  # no pixel
    ]
    pixels = np.stack([np.concatenate(p, axis=-1) for p in tracks], axis=1)
    ours = track_window_2d(pixels, crop_x, crop_y, side, SIZE)
    theirs = y2r_oracle.window_2d(pixels.astype(np.float32), crop_x, crop_y, side, SIZE)
    assert ours is not None and theirs is not None
    assert_identical(ours[0], theirs[0])
    assert_identical(ours[1], theirs[1])
    assert ours[0].shape == (7, 2)  # step 0 holds the fewest: 4 and 7 lie on the right and bottom edges there
    np.testing.assert_allclose(ours[0][0], [100 / 384, (200 - 64) / 384], rtol=1e-6)


def test_a_window_with_no_pixel_inside_the_crop_at_some_step_or_no_step_gets_no_group() -> None:
    pixels = np.array([[[10.0, 100.0]], [[500.0, 100.0]]])  # the only point leaves at step 1
    assert track_window_2d(pixels, 0, 64, 384, SIZE) is None
    assert track_window_2d(np.zeros((0, 3, 2)), 0, 64, 384, SIZE) is None


def wrist_poses() -> np.ndarray:
    """Four steps of a wrist turning and moving, 0.6 m to 0.9 m from the camera (not at z = 1)."""
    poses = np.tile(np.eye(4), (4, 1, 1))
    for t in range(4):
        poses[t, :3, :3] = rot_z(0.3 + 0.07 * t) @ rot_z(0.01 * t**2).T
        poses[t, :3, 3] = [0.05 * t - 0.1, 0.02 * t + 0.03, 0.6 + 0.1 * t]
    return poses


def test_hand_windows_equal_y2rs_in_float32_even_from_float64_poses() -> None:
    poses = wrist_poses()
    K = (K_EDGE * np.float32(0.77)).astype(np.float32)
    K[2, 2] = 1
    ours = hand_window(poses, K, SIZE)
    uvd0, uvd_disp, rot0, rot = y2r_oracle.hand_window(poses.astype(np.float32), K, SIZE, 4)
    assert_identical(ours["wrist_query_uvd"], uvd0)
    assert_identical(ours["wrist_uvd_displacements"], uvd_disp)
    assert_identical(ours["wrist_query_rot_6d"], rot0)
    assert_identical(ours["wrist_rot_displacements"], rot)
    np.testing.assert_allclose(ours["wrist_query_uvd"][2], 0.6)  # the wrist's own depth
    np.testing.assert_allclose(ours["wrist_uvd_displacements"][3, 2], 0.3, rtol=1e-6)


@pytest.mark.parametrize("wrist", [(0.1, 0.0, 0.0), (0.0, 0.0, 0.0)], ids=["on the camera plane", "at the camera"])
def test_a_wrist_on_the_camera_plane_gives_non_finite_values_and_no_warnings(wrist) -> None:
    """A worker's log is not filled with numpy's division warnings for a degenerate hand pose."""
    poses = wrist_poses()
    poses[2, :3, 3] = wrist
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = hand_window(poses, K_EDGE, SIZE)
    assert not np.isfinite(out["wrist_uvd_displacements"][2, :2]).any()

"""The HDF5 writer on hand-made inputs whose every stored number is known in advance."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from tasks.errors import BadInput
from tasks.stages.h5 import H5Stage
from tasks.stages.tracks import TracksStage

T, L = 12, 10
K_FRAME = np.array([[300.0, 0.0, 256.0], [0.0, 300.0, 192.0], [0.0, 0.0, 1.0]], np.float32)
FX_CROP, C_CROP = 200.0, 128.0  # 300 * 256/384; (256 - 64) * 256/384 and 192 * 256/384


def rot_z(a: float) -> np.ndarray:
    return np.array([[np.cos(a), -np.sin(a), 0.0], [np.sin(a), np.cos(a), 0.0], [0.0, 0.0, 1.0]])


def window_points() -> np.ndarray:
    """Six points over 10 steps in the window's camera: A, C, E, F stay; B and D go."""
    t = np.arange(L, dtype=np.float64)
    zero, one = np.zeros(L), np.ones(L)
    return np.stack(
        [
            np.stack([zero, zero, one], -1),  # A: centre of the image
            np.stack([0.1 * t, zero, one], -1),  # B: u = (20 t + 128) / 256 > 1 from step 7
            np.stack([0.06 * t, zero, one], -1),  # C: drifts right, still inside at step 9
            np.stack([zero, zero, 1 - 0.2 * t], -1),  # D: reaches the camera plane at step 5
            np.stack([zero, zero, 3 * one], -1),  # E: beyond depth_max
            np.stack([zero, zero, 0.05 + 0.01 * t], -1),  # F: nearer than depth_min
        ],
        axis=1,
    ).astype(np.float32)


def make_inputs(tmp_path: Path) -> dict:
    points = np.stack([window_points(), np.full((L, 6, 3), 10.0, np.float32), window_points()])  # window 1: N = 0
    poses = np.tile(np.eye(4, dtype=np.float32), (3, L, 1, 1))
    for t in range(L):
        poses[0, t, :3, :3] = rot_z(0.1 * t)
        poses[0, t, :3, 3] = [0.01 * t, 0.02 * t, 0.03 * t]
    tracks = {
        "window_starts": np.arange(3, dtype=np.int64),
        "tracks": points,
        "num_points": np.full(3, 6, np.int64),
        "window_poses": poses,
        "intrinsics": K_FRAME,
        "num_frames": np.int64(T),
        "resolution": np.array([384, 512], np.int64),
        "window_length": np.int64(L),
    }
    wrist = np.tile(np.eye(4, dtype=np.float32), (T, 1, 1))
    for i in range(T):
        wrist[i, :3, :3] = rot_z(0.05 * i)
        wrist[i, :3, 3] = [0.01 * i, 0.0, 1.0]
    right = wrist.copy()
    right[11] = np.nan
    hands = {"intrinsics": K_FRAME, "left_valid": np.ones(T, bool), "left_wrist_pose": wrist}
    hands |= {"right_valid": np.arange(T) != 11, "right_wrist_pose": right}
    depths = np.ones((T, 384, 512), np.float16)
    for (r, c), v in {
        (0, 64): np.nan,
        (0, 65): np.inf,
        (0, 67): -1,
        (0, 68): 0,
        (1, 64): 0.05,
        (1, 65): 3.0,
        (1, 67): 1.5,
        (1, 68): 0.1,
    }.items():
        depths[:, r, c] = v
    frames = np.zeros((T, 384, 512, 3), np.uint8)
    frames[:, :, :64, 0] = 255  # red outside the square crop only
    out = str(tmp_path / "clip.hdf5")
    return {
        "frames": frames,
        "depths": depths,
        "tracks": tracks,
        "hands": hands,
        "text": "fold the towel",
        "out_path": out,
    }


@pytest.fixture
def written(tmp_path: Path) -> tuple[dict, h5py.File]:
    result = H5Stage().run(make_inputs(tmp_path))
    with h5py.File(tmp_path / "clip.hdf5", "r") as f:
        yield result, f


def test_root_layout_and_scalars(written) -> None:
    result, f = written
    assert list(f.keys()) == ["root"]
    root = f["root"]
    assert set(root) == {"video", "depth", "intrinsics", "tracks", "num_frames", "num_track_ts", "track_type", "text"}
    assert root["video"].dtype == np.uint8 and root["video"].shape == (T, 3, 256, 256)
    assert root["video"][()].max() <= 1  # the red band lies outside the crop
    for name, value in (("num_frames", T), ("num_track_ts", 10)):
        assert root[name].shape == () and root[name].dtype == np.int64 and root[name][()] == value
    for name, value in (("track_type", "3d"), ("text", "fold the towel")):
        assert h5py.check_string_dtype(root[name].dtype).length is None
        assert root[name].asstr()[()] == value
    assert result["num_frames"] == T and result["num_windows"] == 3


def test_crop_intrinsics(written) -> None:
    K = written[1]["root/intrinsics"]
    assert K.dtype == np.float32
    np.testing.assert_allclose(K[()], [[FX_CROP, 0, C_CROP], [0, FX_CROP, C_CROP], [0, 0, 1]], rtol=1e-6)


def test_depth_is_cropped_nearest_and_clipped(written) -> None:
    depth = written[1]["root/depth"][()]
    assert depth.dtype == np.float32 and depth.shape == (T, 256, 256)
    # Destination (i, j) samples source (floor(1.5 i), 64 + floor(1.5 j)).
    assert depth[0, 0, :4].tolist() == [0.0, 0.0, -1.0, 0.0]  # NaN, inf -> 0; a negative kept, as y2r; zero
    np.testing.assert_allclose(depth[0, 1, :4], [0.1, 2.5, 1.5, 0.1], rtol=1e-6)
    assert np.all(depth[:, 2:, :] == 1.0)


def test_point_filter_query_clipping_and_displacements(written) -> None:
    g = written[1]["root/tracks/frame_0000"]
    q, disp = g["query_coords"][()], g["displacements"][()]
    assert q.dtype == disp.dtype == np.float32 and q.shape == (4, 3) and disp.shape == (10, 4, 3)
    # Kept in order: A, C, E, F (B leaves at step 7, D reaches z = 0 at step 5).
    np.testing.assert_allclose(q, [[0.5, 0.5, 1.0], [0.5, 0.5, 1.0], [0.5, 0.5, 2.5], [0.5, 0.5, 0.1]], rtol=1e-6)
    assert np.all(disp[0] == 0)
    t = np.arange(10)
    np.testing.assert_allclose(disp[:, 1, 0], FX_CROP * 0.06 * t / 256, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(disp[:, 2, 2], 0.0)  # E: unclipped depth does not move
    np.testing.assert_allclose(disp[:, 3, 2], 0.01 * t, atol=1e-6)  # F: relative to the unclipped 0.05


def test_a_window_whose_points_all_leave_is_still_written(written) -> None:
    g = written[1]["root/tracks/frame_0001"]
    assert g["query_coords"].shape == (0, 3) and g["displacements"].shape == (10, 0, 3)
    assert g["poses"].shape == (10, 9)


def test_poses_row_order(written) -> None:
    poses = written[1]["root/tracks/frame_0000/poses"][()]
    t = np.arange(10)
    c, s = np.cos(0.1 * t), np.sin(0.1 * t)
    expected = np.stack([c, s, 0 * t, -s, c, 0 * t, 0.01 * t, 0.02 * t, 0.03 * t], -1)
    np.testing.assert_allclose(poses, expected, atol=1e-6)


def test_hands_only_where_valid_on_all_ten_steps(written) -> None:
    tracks = written[1]["root/tracks"]
    has = {name: sorted(k.split("_")[0] for k in tracks[name] if k.endswith("query_uvd")) for name in tracks}
    assert has == {"frame_0000": ["left", "right"], "frame_0001": ["left", "right"], "frame_0002": ["left"]}
    g = tracks["frame_0002"]
    t = np.arange(10)
    np.testing.assert_allclose(g["left_wrist_query_uvd"], [(FX_CROP * 0.02 + C_CROP) / 256, 0.5, 1.0], rtol=1e-6)
    uvd_disp = g["left_wrist_uvd_displacements"][()]
    np.testing.assert_allclose(uvd_disp, np.stack([FX_CROP * 0.01 * t / 256, 0 * t, 0 * t], -1), atol=1e-6)
    np.testing.assert_allclose(
        g["left_wrist_query_rot_6d"], [np.cos(0.1), np.sin(0.1), 0, -np.sin(0.1), np.cos(0.1), 0]
    )
    c, s = np.cos(0.05 * t), np.sin(0.05 * t)
    rot = g["left_wrist_rot_displacements"][()]
    np.testing.assert_allclose(rot, np.stack([c, s, 0 * t, -s, c, 0 * t], -1), atol=1e-6)
    assert rot.dtype == np.float32 and rot.shape == (10, 6) and g["left_wrist_query_uvd"].shape == (3,)


def test_returned_statistics_count_what_the_contract_pools(written) -> None:
    stats = written[0]["stats"]
    assert stats["track_type"] == "3d"
    assert stats["displacement"]["count"] == 2 * 10 * 4  # the N = 0 window adds nothing
    assert stats["pose"]["count"] == 3 * 10  # every window's poses
    assert stats["hand_uvd"]["count"] == stats["hand_rot"]["count"] == 5 * 10
    assert stats["depth"]["count"] == T * (256 * 256 - 4) + 2 * 4


def test_short_video_makes_no_window_group(tmp_path: Path) -> None:
    frames = np.random.default_rng(0).integers(0, 255, (8, 384, 512, 3), dtype=np.uint8)
    depths = np.ones((8, 384, 512), np.float16)
    tracks = TracksStage("synthetic").run(
        {
            "frames": frames,
            "depths": depths,
            "intrinsics": np.tile(K_FRAME, (8, 1, 1)),
            "extrinsics": np.tile(np.eye(4, dtype=np.float32), (8, 1, 1)),
        }
    )
    assert tracks["tracks"].shape == (0, 10, 64, 3) and tracks["window_starts"].shape == (0,)
    out = tmp_path / "short.hdf5"
    result = H5Stage().run(
        {"frames": frames, "depths": depths, "tracks": tracks, "hands": {}, "text": "", "out_path": str(out)}
    )
    with h5py.File(out, "r") as f:
        assert len(f["root/tracks"]) == 0 and "text" not in f["root"]
    assert result["num_windows"] == 0 and result["stats"]["displacement"]["count"] == 0


def test_windows_shorter_than_num_track_ts_are_skipped(tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path)
    result = H5Stage(num_track_ts=11).run(inputs)
    assert result["num_windows"] == 0


def test_2d_track_type_follows_y2r_per_step_rule(tmp_path: Path) -> None:
    result = H5Stage(track_type="2d").run(make_inputs(tmp_path))
    with h5py.File(tmp_path / "clip.hdf5", "r") as f:
        root = f["root"]
        assert set(root) == {"video", "tracks", "num_frames", "num_track_ts", "track_type", "text"}
        assert root["track_type"].asstr()[()] == "2d"
        # Window 1 has no point inside the crop at any step: y2r writes no group for it.
        assert sorted(root["tracks"]) == ["frame_0000", "frame_0002"]
        g = root["tracks/frame_0000"]
        assert set(g) == {"query_coords", "displacements"}
        q, disp = g["query_coords"][()], g["displacements"][()]
    # Per step, the points inside the crop in query order, cut to the smallest count (4, steps 7-9).
    # D is behind the camera from step 5 and B leaves at step 7 (u = 0.5 + 0.1 t * 200/256 > 1),
    # so steps 5-6 hold A, B, C, E and steps 7-9 hold A, C, E, F: row 1 is B, then C.
    assert q.shape == (4, 2) and disp.shape == (10, 4, 2)
    t = np.arange(10)
    u = 0.5 + disp[:, :, 0]
    np.testing.assert_allclose(u[:5, 1], 0.5 + FX_CROP * 0.1 * t[:5] / 256, rtol=1e-6)  # B, steps 0-4
    np.testing.assert_allclose(u[5:7, 1], 0.5 + FX_CROP * 0.1 * t[5:7] / 256, rtol=1e-6)  # still B
    np.testing.assert_allclose(u[7:, 1], 0.5 + FX_CROP * 0.06 * t[7:] / 256, rtol=1e-6)  # C's track now
    assert result["stats"]["displacement"]["count"] == 80 and len(result["stats"]["displacement"]["mean"]) == 2
    assert result["num_windows"] == 2


def test_tracks_for_another_video_are_refused(tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path)
    inputs["tracks"]["num_frames"] = np.int64(T + 1)
    with pytest.raises(BadInput, match="tracks were made for 13 frames"):
        H5Stage().run(inputs)

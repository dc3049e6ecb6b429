"""Depth, tracks and hands stages with the synthetic backends; backend lookup and knobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.backends import get_backend
from tasks.errors import BadInput, UnknownBackend
from tasks.outputs.geometry import project_uvd
from tasks.stages.depth import DepthStage
from tasks.stages.hands import HandsStage, fill_gaps, velocity_filter
from tasks.stages.tracks import TracksStage

ROOT = Path(__file__).resolve().parents[2]


def textured(T: int, seed: int) -> np.ndarray:
    """Frames with large bright and dark regions that drift, so the synthetic depth is not flat."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:384, 0:512]
    fx, fy, ph = rng.uniform(0.01, 0.03), rng.uniform(0.01, 0.03), rng.uniform(0, 6)
    frames = [127 + 120 * np.sin(fx * xx + fy * yy + ph + 0.1 * t) for t in range(T)]
    return np.repeat(np.stack(frames)[..., None], 3, axis=-1).astype(np.uint8)


@pytest.fixture(scope="module")
def depth_out() -> tuple[np.ndarray, dict]:
    frames = textured(16, 0)
    stage = DepthStage("synthetic")
    stage.load("cpu")
    return frames, stage.run({"frames": frames})


def test_unknown_backend_names_stage_name_and_choices() -> None:
    with pytest.raises(UnknownBackend, match=r"unknown depth backend 'dpt'; available: classical, synthetic, vipe"):
        DepthStage(backend="dpt")
    with pytest.raises(UnknownBackend, match="unknown h5 backend 'synthetic'; available: none"):
        get_backend("h5", "synthetic")
    with pytest.raises(TypeError, match=r"unknown parameters \['no_such_knob'\]; its knobs are hold_mib"):
        TracksStage("synthetic", no_such_knob=1)


def test_importing_stages_and_backends_loads_no_torch() -> None:
    # The package's own __init__ (the Celery app) is bypassed: this checks these modules alone.
    code = (
        "import sys, types; pkg = types.ModuleType('tasks'); pkg.__path__ = ['tasks']; sys.modules['tasks'] = pkg\n"
        "import tasks.stages, tasks.stages.depth, tasks.stages.tracks, tasks.stages.hands, tasks.stages.h5\n"
        "import tasks.stages.preprocess, tasks.backends.synthetic, tasks.statistics.stats, tasks.outputs.geometry\n"
        "DS = tasks.stages.stage_class('depth'); DS('synthetic', hold_mib=1)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_memory_knobs_hold_and_release() -> None:
    model = get_backend("depth", "synthetic", hold_mib=2, activation_mib=1, matmuls_per_frame=1)
    model.load("cpu")
    assert model._held.numel() == 2 << 20
    with model.activations():
        model.spend(3)
    assert model.peak_memory_bytes == 0  # measured on CUDA only


def test_depth_outputs(depth_out) -> None:
    frames, out = depth_out
    assert out["depths"].dtype == np.float16 and out["depths"].shape == (16, 384, 512)
    assert float(out["depths"].min()) >= 0.39 and float(out["depths"].max()) <= 2.41
    K = out["intrinsics"]
    assert K.dtype == np.float32 and K.shape == (16, 3, 3)
    np.testing.assert_allclose(K[5], [[0.9 * 512, 0, 256], [0, 0.9 * 512, 192], [0, 0, 1]])
    E = out["extrinsics"]
    assert E.dtype == np.float32 and E.shape == (16, 4, 4)
    raw = get_backend("depth", "synthetic").infer(frames)
    np.testing.assert_allclose(E.astype(np.float64) @ raw["cam_to_world"], np.tile(np.eye(4), (16, 1, 1)), atol=1e-6)
    assert np.abs(np.diff(E[:, :3, 3], axis=0)).max() > 0  # the camera moves


def test_depth_is_deterministic_and_depends_on_the_frames(depth_out) -> None:
    frames, out = depth_out
    again = DepthStage("synthetic").run({"frames": frames})
    assert all(np.array_equal(out[k], again[k]) for k in out)
    other = DepthStage("synthetic").run({"frames": textured(16, 1)})
    assert not np.array_equal(out["depths"], other["depths"])
    assert not np.array_equal(out["extrinsics"], other["extrinsics"])


def test_flat_depth_fails_y2rs_quality_gate_and_empty_videos_are_bad_input() -> None:
    from tasks.errors import LowQuality
    from tasks.pipeline.quality import enforce
    from worker_config.settings import QualityGates

    flat = np.full((10, 384, 512, 3), 128, np.uint8)
    flat[0] = textured(1, 0)[0]  # one textured frame of ten: 90 % flat > 10 %
    measured = DepthStage("synthetic").run({"frames": flat})["quality"]
    assert measured["flat_frames"] == 9 and measured["flat_frame_pct"] == 90.0
    with pytest.raises(LowQuality, match=r"depth flat_frame_pct 90.0 \(quality.max_flat_frame_pct: 10.0\)"):
        enforce({"depth": measured}, QualityGates())
    enforce({"depth": measured}, QualityGates(max_flat_frame_pct=95))  # a looser gate lets it through
    with pytest.raises(BadInput, match="no frames"):
        DepthStage("synthetic").run({"frames": np.zeros((0, 384, 512, 3), np.uint8)})
    with pytest.raises(BadInput, match=r"'frames' must have shape \(\*, \*, \*, 3\)"):
        DepthStage("synthetic").run({"frames": np.zeros((4, 384, 512), np.uint8)})


def test_tracks_windows_queries_and_poses(depth_out) -> None:
    frames, depth = depth_out
    depths = depth["depths"].copy()
    depths[:, :, 256:] = 0  # only the left half has depth: queries must come from there
    stage = TracksStage("synthetic")
    stage.load("cpu")
    out = stage.run({"frames": frames, **depth, "depths": depths})
    W = 16 - 10 + 1
    assert out["window_starts"].tolist() == list(range(W))
    assert out["tracks"].shape == (W, 10, 64, 3) and out["tracks"].dtype == np.float32
    assert out["num_points"].tolist() == [64] * W
    assert out["resolution"].tolist() == [384, 512] and int(out["num_frames"]) == 16
    E = depth["extrinsics"].astype(np.float64)
    for w in (0, 3):
        np.testing.assert_allclose(out["window_poses"][w], np.linalg.inv(E[w]) @ E[w : w + 10], atol=1e-6)
        uv = np.rint(project_uvd(out["tracks"][w, 0], out["intrinsics"], 1.0)[:, :2]).astype(int)
        assert np.all(uv[:, 0] < 256)  # from pixels with depth > 0
        flat = uv[:, 1] * 512 + uv[:, 0]
        assert np.all(np.diff(flat) > 0)  # sorted row-major
        np.testing.assert_allclose(out["tracks"][w, 0, :, 2], depths[w][uv[:, 1], uv[:, 0]], rtol=1e-3)
    assert np.abs(out["tracks"][:, 9] - out["tracks"][:, 0]).max() > 0.05  # the scene moves
    assert not np.array_equal(out["tracks"][0, 0], out["tracks"][1, 0])  # a new draw per window
    again = TracksStage("synthetic").run({"frames": frames, **depth, "depths": depths})
    assert np.array_equal(out["tracks"], again["tracks"])


def test_velocity_filter_compares_with_the_last_kept_frame() -> None:
    x = np.array([0.0, 0.05, 0.9, 0.1, 0.15, 0.16])
    positions = np.stack([x, 0 * x, 0 * x], -1)
    valid = np.array([True, True, True, True, False, True])
    kept = velocity_filter(valid, positions, max_step_m=0.1)
    assert kept.tolist() == [True, True, False, True, False, True]


def test_fill_gaps_linear_positions_and_slerp_rotations() -> None:
    def rz(a: float) -> np.ndarray:
        return np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])

    T = 8
    side = {
        "valid": np.array([False, True, False, False, True, False, True, False]),
        "wrist_pose": np.full((T, 4, 4), np.nan),
        "hand_pose": np.full((T, 15, 3, 3), np.nan),
        "joints_3d": np.full((T, 21, 3), np.nan),
    }
    for i, a in ((1, 0.0), (4, 0.3), (6, 0.5)):
        side["wrist_pose"][i] = np.eye(4)
        side["wrist_pose"][i, :3, :3] = rz(a)
        side["wrist_pose"][i, :3, 3] = [a, 0, 1]
        side["hand_pose"][i] = a
        side["joints_3d"][i] = a
    fill_gaps(side, max_gap=2)
    assert side["valid"].tolist() == [False, True, True, True, True, True, True, False]
    np.testing.assert_allclose(side["wrist_pose"][2, :3, :3], rz(0.1), atol=1e-12)
    np.testing.assert_allclose(side["wrist_pose"][3, :3, 3], [0.2, 0, 1])
    np.testing.assert_allclose(side["wrist_pose"][5, 3], [0, 0, 0, 1])
    np.testing.assert_allclose(side["joints_3d"][5], 0.4)
    assert np.isnan(side["wrist_pose"][0]).all() and np.isnan(side["wrist_pose"][7]).all()
    long_gap = {k: v.copy() for k, v in side.items()}
    long_gap["valid"] = np.array([True, False, False, False, True, False, False, False])
    fill_gaps(long_gap, max_gap=2)
    assert long_gap["valid"].tolist() == [True, False, False, False, True, False, False, False]


def test_hands_stage_outputs(depth_out) -> None:
    frames, depth = depth_out
    frames = np.concatenate([frames, frames[::-1], frames])  # 48 frames: room for the long left gap
    stage = HandsStage("synthetic")
    stage.load("cpu")
    calls: list = []
    out = stage.run(
        {"frames": frames, "intrinsics": depth["intrinsics"][0], "fps": 10.0}, progress=lambda *a: calls.append(a)
    )
    assert calls and out["intrinsics"].shape == (3, 3)
    T = len(frames)
    for side in ("left", "right"):
        valid = out[f"{side}_valid"]
        assert valid.dtype == bool and valid.shape == (T,)
        shapes = {"wrist_pose": (T, 4, 4), "hand_pose": (T, 15, 3, 3), "joints_3d": (T, 21, 3)}
        for key, shape in shapes.items():
            arr = out[f"{side}_{key}"]
            assert arr.shape == shape and arr.dtype == np.float32
            assert np.isfinite(arr[valid]).all() and np.isnan(arr[~valid]).all()
        assert out[f"{side}_betas"].shape == (10,)
        z = out[f"{side}_wrist_pose"][valid, 2, 3]
        assert np.abs(np.diff(z)).max() < 0.1  # outliers filtered, gaps bridged smoothly
    assert out["right_valid"].all()  # short dropouts and outliers are filled
    assert not out["left_valid"].all()  # the 22-frame gap is longer than max_interpolation_gap
    assert not np.array_equal(out["left_wrist_pose"][out["left_valid"]], out["right_wrist_pose"][out["left_valid"]])


def test_a_failing_progress_callback_does_not_fail_the_stage(depth_out) -> None:
    frames, _ = depth_out

    def broken(done: int, total: int) -> None:
        raise RuntimeError("display went away")

    assert DepthStage("synthetic").run({"frames": frames}, progress=broken)["depths"].shape == (16, 384, 512)

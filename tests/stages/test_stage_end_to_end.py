"""The five stages in-process on one encoded video, read back the way y2r's training reads it."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import av
import h5py
import numpy as np
import pytest
import yaml

from tasks.cli import verify as verify_dataset
from tasks.stages import stage_class
from tasks.statistics.stats import VideoStats, normalization_stats, write_stats_yaml

ROOT = Path(__file__).resolve().parents[2]


def encode(path: Path, n: int = 90, fps: int = 30, w: int = 640, h: int = 360) -> None:
    """A textured clip whose bright and dark bands drift, at 30 fps."""
    yy, xx = np.mgrid[0:h, 0:w]
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            grey = 127 + 120 * np.sin(0.02 * xx + 0.015 * yy + 0.05 * i)
            img = np.stack([grey, np.roll(grey, 40, axis=1), 255 - grey], -1).astype(np.uint8)
            c.mux(s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        c.mux(s.encode())


def through_npz(outputs: dict) -> dict:
    """Save and load as the Celery side does (no pickle): proves the outputs are npz-safe."""
    from tasks.stages.base import REPORT_KEYS

    buf = io.BytesIO()
    np.savez(buf, **{k: v for k, v in outputs.items() if k not in REPORT_KEYS})  # those go to the marker
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("e2e")
    encode(work / "clip.mp4")
    out = work / "out"
    out.mkdir()
    stages = {name: stage_class(name)() for name in ("preprocess", "h5")}
    stages.update({name: stage_class(name)("synthetic") for name in ("depth", "tracks", "hands")})
    for stage in stages.values():
        stage.load("cpu")
    pre = through_npz(stages["preprocess"].run({"video_path": str(work / "clip.mp4")}))
    depth = through_npz(stages["depth"].run({"frames": pre["frames"]}))
    tracks = through_npz(stages["tracks"].run({"frames": pre["frames"], **depth}))
    hands_in = {"frames": pre["frames"], "intrinsics": depth["intrinsics"][0], "fps": float(pre["fps"])}
    hands = through_npz(stages["hands"].run(hands_in))
    h5_in = {"frames": pre["frames"], "depths": depth["depths"], "tracks": tracks, "hands": hands}
    result = stages["h5"].run({**h5_in, "text": "stack the cups", "out_path": str(out / "clip.hdf5")})
    assert result["num_frames"] == 30 and result["num_windows"] == 21
    total = sum([VideoStats.from_dict(result["stats"])], start=VideoStats.empty("3d"))
    write_stats_yaml(out / "normalization_stats.yaml", normalization_stats(total))
    return out


def load_h5(path: Path) -> dict:
    """y2r's SimpleBaseDataset.load_h5: every dataset under every group into nested dicts of arrays."""

    def to_dict(group: h5py.Group) -> dict:
        return {k: to_dict(v) if isinstance(v, h5py.Group) else np.array(v) for k, v in group.items()}

    with h5py.File(path, "r") as f:
        return to_dict(f)


def read_str(x: np.ndarray) -> str:
    """Training reads strings with str(x.item()); h5py >= 3 hands vlen str back as bytes, so decode those."""
    value = x.item()
    return value.decode() if isinstance(value, bytes) else str(value)


def samples(demo: dict, stats: dict, num_track_ts: int = 10, frame_stack: int = 1):
    """Assemble every training sample as y2r's TrackDataset.__getitem__ does (no augmentation)."""
    root = demo["root"]
    for key, frame_data in sorted(root["tracks"].items()):
        t = int(key.split("_")[1])
        idx = np.clip(np.arange(t - frame_stack + 1, t + 1), 0, len(root["video"]) - 1)
        imgs = (root["video"][idx] / 255.0 - np.array(stats["imagenet_mean"])[:, None, None]) / np.array(
            stats["imagenet_std"]
        )[:, None, None]
        q = frame_data["query_coords"].copy()
        q[:, 2] = (q[:, 2] - stats["depth_mean"]) / (stats["depth_std"] + 1e-8)
        disp = (frame_data["displacements"][:num_track_ts] - stats["displacement_mean"]) / (
            np.array(stats["displacement_std"]) + 1e-8
        )
        poses = (frame_data["poses"][:num_track_ts] - stats["pose_mean"]) / (np.array(stats["pose_std"]) + 1e-8)
        depth = (root["depth"][t + np.arange(num_track_ts)] - stats["depth_mean"]) / (stats["depth_std"] + 1e-8)
        hands = {
            side: (
                frame_data[f"{side}_wrist_query_uvd"],
                frame_data[f"{side}_wrist_uvd_displacements"],
                frame_data[f"{side}_wrist_query_rot_6d"],
                frame_data[f"{side}_wrist_rot_displacements"],
            )
            for side in ("left", "right")
            if f"{side}_wrist_query_uvd" in frame_data
        }
        yield {"imgs": imgs, "query_coords": q, "displacements": disp, "poses": poses, "depth": depth, "hands": hands}


def test_reader_from_the_contract_assembles_training_samples(dataset: Path) -> None:
    demo = load_h5(dataset / "clip.hdf5")
    with open(dataset / "normalization_stats.yaml") as f:
        stats = yaml.safe_load(f)
    root = demo["root"]
    assert read_str(root["track_type"]) == stats["track_type"] == "3d"
    assert read_str(root["text"]) == "stack the cups"
    assert int(root["num_frames"]) == 30 and int(root["num_track_ts"]) == 10
    assert root["intrinsics"].shape == (3, 3) and root["depth"].shape == (30, 256, 256)
    items = list(samples(demo, stats))
    assert len(items) == 21 and sum(bool(s["hands"]) for s in items) > 0
    for s in items:
        n = len(s["query_coords"])
        assert s["imgs"].shape == (1, 3, 256, 256) and s["displacements"].shape == (10, n, 3)
        assert s["poses"].shape == (10, 9) and s["depth"].shape == (10, 256, 256)
        assert all(np.isfinite(v).all() for k, v in s.items() if k != "hands")
        for q_uvd, uvd_disp, q_rot, rot_disp in s["hands"].values():
            assert (
                q_uvd.shape == (3,) and uvd_disp.shape == (10, 3) and q_rot.shape == (6,) and rot_disp.shape == (10, 6)
            )
    # The statistics normalise exactly the data they were computed from.
    disp = np.concatenate([s["displacements"].reshape(-1, 3) for s in items]).astype(np.float64)
    np.testing.assert_allclose(disp.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(disp.std(axis=0), 1, atol=1e-5)
    assert stats["displacement_num_samples"] == len(disp) and stats["pose_num_samples"] == 21 * 10


def test_verify_passes_and_catches_a_tampered_stats_file(dataset: Path) -> None:
    assert verify_dataset.verify(dataset) == []
    run = subprocess.run(
        [sys.executable, "scripts/verify_dataset.py", str(dataset)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.startswith("OK: 1 files, 21 windows"), run.stdout + run.stderr

    stats = yaml.safe_load((dataset / "normalization_stats.yaml").read_text())
    stats["pose_mean"][6] *= 1 + 1e-7
    tampered = dataset / "tampered.yaml"
    write_stats_yaml(tampered, stats)
    problems = verify_dataset.verify(dataset, tampered)
    assert len(problems) == 1 and "pose_mean[6]" in problems[0]
    cli = [sys.executable, "scripts/verify_dataset.py", str(dataset), "--stats", str(tampered)]
    run = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 1 and "pose_mean[6]" in run.stdout and "FAILED" in run.stdout

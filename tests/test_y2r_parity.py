"""A real run's files equal what y2r's own writer makes from the same intermediates, to the value.

One local cluster (real Redis, real workers) runs three real encoded videos with a
metadata.csv; tests/y2r_oracle.py, a re-statement of y2r's ``process_video``, is then fed that
run's intermediates (OUT/work/<video_id>/*.npz) in the form y2r reads them, and every dataset
of every file must agree: names, dtypes, shapes, video pixels and integers exactly, floats to
1e-6; the statistics to 1e-9 relative. The 2D files are made by the h5 stage class on the
same intermediates; the oracle computes the pixels of the 3D tracks itself (``y2r_oracle.frame_pixels``),
never from framefleet's own. A copy of one video's depth with negative and non-finite values checks
y2r's depth rule where the synthetic depth never goes.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import cv2
import h5py
import numpy as np
import pytest
import yaml

from tasks.outputs.geometry import crop_intrinsics, square_crop
from tasks.outputs.storage import load_npz
from tasks.stages import stage_class
from tasks.stages.h5 import H5Stage
from tasks.statistics.stats import VideoStats, normalization_stats
from tests import y2r_oracle
from tests.conftest import ONE_WORKER_EACH, PIPELINE_ENV, ROOT, run_script

UMASK = 0o002  # not the usual 022, so a hard-coded 0644 would fail as surely as mkstemp's 0600
TEXTS = {"clip 00": ("cup", "pick up the red cup"), "1": ("towel", "fold the towel"), "2": ("lid", "open the lid")}


def datasets(path: Path) -> dict[str, Any]:
    """Every dataset of an HDF5 file by path; strings decoded, with a flag that they are vlen str."""
    found: dict[str, Any] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            info = h5py.check_string_dtype(obj.dtype)
            if info is not None:
                assert info.length is None and obj.shape == (), f"{name} is not a scalar vlen str"
                found[name] = obj.asstr()[()]
            else:
                found[name] = obj[()]

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return found


def assert_same(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    assert sorted(ours) == sorted(theirs), f"{where}: dataset names differ: {set(ours) ^ set(theirs)}"
    for name, want in theirs.items():
        got = ours[name]
        if isinstance(want, str):
            assert got == want, f"{where}:{name}"
            continue
        want = np.asarray(want)
        assert got.dtype == want.dtype and got.shape == want.shape, (
            f"{where}:{name} is {got.dtype} {got.shape}, y2r writes {want.dtype} {want.shape}"
        )
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=f"{where}:{name}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{where}:{name}")


def assert_stats(found: dict[str, Any], want: dict[str, Any]) -> None:
    for key, value in want.items():
        if isinstance(value, (str, int)):
            assert found[key] == value, key
        else:
            np.testing.assert_allclose(found[key], value, rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.fixture(scope="module")
def run(video_factory, tmp_path_factory) -> Path:
    """A finished local-cluster run over three real videos with a metadata.csv, under umask 002."""
    work = tmp_path_factory.mktemp("parity")
    raw = work / "raw"
    shutil.copytree(video_factory(3), raw)
    with open(raw / "metadata.csv", "w", newline="") as fh:
        rows = csv.writer(fh)
        rows.writerow(["clip_id", "noun", "text"])
        for clip, (noun, text) in TEXTS.items():  # a path id and two of y2r's numeric ids
            rows.writerow([clip, noun, text])
    env = {k: v for k, v in os.environ.items() if k not in PIPELINE_ENV}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    old = os.umask(UMASK)
    try:
        done = run_script(
            "run_local.py",
            str(raw),
            "--out",
            str(work / "out"),
            "--require-text",
            *ONE_WORKER_EACH,
            env=env,
            timeout_s=280,
        )
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stdout + done.stderr
    return work / "out"


def videos(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "manifest.json").read_text())["videos"]


def intermediates(out: Path, vid: str) -> dict[str, dict[str, np.ndarray]]:
    return {s: load_npz(out / "work" / vid / f"{s}.npz") for s in ("preprocess", "depth", "tracks", "hands")}


def png_frames(frames: np.ndarray, folder: Path) -> list[Path]:
    """The frames as y2r's preprocess leaves them: cv2.imwrite of BGR to 00000.png, ... (preprocess.py L118-119)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, frame in enumerate(frames):
        paths.append(folder / f"{i:05d}.png")
        assert cv2.imwrite(str(paths[-1]), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    return paths


def y2r_tracks(tracks: dict[str, np.ndarray], pixels: bool = False) -> dict[str, Any]:
    """The TAPIP3D dict y2r reads (process_tapip3d.py L507-513), or CoTracker's 2D one from frame pixels."""
    out: dict[str, Any] = {"windows": [], "tracks": [], "window_poses": [], "intrinsics": tracks["intrinsics"]}
    L = int(tracks["window_length"])
    for w, s in enumerate(tracks["window_starts"].tolist()):
        pts = tracks["tracks"][w, :, : int(tracks["num_points"][w])]
        if pixels:  # framefleet's 2D tracks (CoTracker's role) are its 3D tracks seen by the frame's camera
            pts = y2r_oracle.frame_pixels(pts, tracks["intrinsics"])
        out["windows"].append((s, s + L))
        out["tracks"].append(np.ascontiguousarray(pts)[None])
        out["window_poses"].append(tracks["window_poses"][w])
    return out


def cotracker(tracks2d: dict[str, np.ndarray]) -> dict[str, Any]:
    """The CoTracker dict y2r's 2D writer reads (process_cotracker.py), from the tracks2d stage's output."""
    out: dict[str, Any] = {"windows": [], "tracks": []}
    L = int(tracks2d["window_length"])
    for w, s in enumerate(tracks2d["window_starts"].tolist()):
        out["windows"].append((s, s + L))
        out["tracks"].append(np.ascontiguousarray(tracks2d["tracks"][w, :, : int(tracks2d["num_points"][w])])[None])
    return out


def oracle(
    out: Path, entry: dict[str, Any], track_type: str, scratch: Path, tracks2d: dict | None = None
) -> tuple[dict, dict]:
    parts = intermediates(out, entry["video_id"])
    frames = png_frames(parts["preprocess"]["frames"], scratch / entry["video_id"])
    return y2r_oracle.process_video(
        frames,
        cotracker(tracks2d) if tracks2d else y2r_tracks(parts["tracks"], pixels=track_type == "2d"),
        track_type,
        depths_f16=parts["depth"]["depths"],
        hand_data=parts["hands"],
        text=entry["text"],
    )


def test_3d_files_equal_y2r_writer_output(run: Path, tmp_path: Path) -> None:
    pools: dict[str, list] = {k: [] for k in ("disp", "depth", "pose", "hand_uvd", "hand_rot")}
    for entry in videos(run):
        want, video_pools = oracle(run, entry, "3d", tmp_path)
        assert_same(datasets(run / f"{entry['video_id']}.hdf5"), want, entry["path"])
        for k in pools:
            pools[k] += video_pools[k]
    found = yaml.safe_load((run / "normalization_stats.yaml").read_text())
    assert_stats(found, y2r_oracle.float64_stats(pools, "3d"))
    assert found["displacement_num_samples"] > 0 and "hand_pose_num_samples" in found


@pytest.mark.parametrize("source", ["tracks2d stage", "3d tracks"])
def test_2d_files_equal_y2r_writer_output(run: Path, tmp_path: Path, source: str) -> None:
    stage = H5Stage(track_type="2d")
    tracker = stage_class("tracks2d")("synthetic")
    tracker.load("cpu")
    pools: dict[str, list] = {k: [] for k in ("disp", "depth", "pose", "hand_uvd", "hand_rot")}
    parts_2d = []
    cut = 0
    for entry in videos(run):
        parts = intermediates(run, entry["video_id"])
        inputs = {
            "frames": parts["preprocess"]["frames"],
            "depths": parts["depth"]["depths"],
            "tracks": parts["tracks"],
            "hands": parts["hands"],
            "text": entry["text"],
            "out_path": str(tmp_path / f"{entry['video_id']}.hdf5"),
        }
        if source == "tracks2d stage":
            inputs["tracks2d"] = tracker.run({"frames": inputs["frames"], "depths": inputs["depths"]})
        result = stage.run(inputs)
        parts_2d.append(VideoStats.from_dict(result["stats"]))
        want, video_pools = oracle(run, entry, "2d", tmp_path, inputs.get("tracks2d"))
        assert_same(datasets(Path(inputs["out_path"])), want, entry["path"])
        pools["disp"] += video_pools["disp"]
        points = (inputs.get("tracks2d") or parts["tracks"])["num_points"]
        cut += int(points.sum()) * 10 - sum(p.size // 2 for p in video_pools["disp"])
    assert_stats(
        normalization_stats(sum(parts_2d, start=VideoStats.empty("2d"))), y2r_oracle.float64_stats(pools, "2d")
    )
    assert cut > 0, "no 2D point left the crop: this run does not exercise y2r's per-step rule"


def test_negative_and_non_finite_depths_are_written_as_y2r_writes_them(run: Path, tmp_path: Path) -> None:
    """y2r keeps a negative depth as it is (only non-finite -> 0, (0, min) -> min, > max -> max); so does framefleet.

    Both count only depths > 0 as valid, so the statistics pool the same samples either way.
    """
    entry = videos(run)[0]
    parts = intermediates(run, entry["video_id"])
    depths = parts["depth"]["depths"].copy()  # float16, (T, 384, 512); the crop keeps x 64..447
    depths[:, 100:140, 200:260] = -0.75
    depths[:, 150:160, 200:260] = -0.01
    depths[0, 200:210, 200:260] = np.float16("-inf")
    depths[1, 200:210, 200:260] = np.float16("nan")
    out_path = tmp_path / f"{entry['video_id']}.hdf5"
    result = H5Stage(track_type="3d").run(
        {
            "frames": parts["preprocess"]["frames"],
            "depths": depths,
            "tracks": parts["tracks"],
            "hands": parts["hands"],
            "text": entry["text"],
            "out_path": str(out_path),
        }
    )
    want, pools = y2r_oracle.process_video(
        png_frames(parts["preprocess"]["frames"], tmp_path / "frames"),
        y2r_tracks(parts["tracks"]),
        "3d",
        depths_f16=depths,
        hand_data=parts["hands"],
        text=entry["text"],
    )
    ours = datasets(out_path)
    assert_same(ours, want, entry["path"])
    assert (ours["root/depth"] < 0).any(), "no negative depth reached the file: the test exercises nothing"
    assert_stats(normalization_stats(VideoStats.from_dict(result["stats"])), y2r_oracle.float64_stats(pools, "3d"))


def test_the_run_exercises_the_crop_edge_where_float64_and_float32_disagree(run: Path) -> None:
    """The float64 K and projection of before kept a point that y2r's float32 steps drop (or the reverse)."""
    flips = 0
    for entry in videos(run):
        tracks = intermediates(run, entry["video_id"])["tracks"]
        crop = square_crop(*tracks["resolution"].tolist())
        K32 = crop_intrinsics(tracks["intrinsics"], *crop, 256)
        K64 = crop_intrinsics(tracks["intrinsics"].astype(np.float64), *crop, 256)
        for w in range(len(tracks["window_starts"])):
            q = tracks["tracks"][w, 0, : int(tracks["num_points"][w])]
            u32, v32, _ = y2r_oracle.project(q, K32, 256)
            uv64 = (K64 @ q.astype(np.float64).T).T
            u64, v64 = uv64[:, 0] / uv64[:, 2] / 256, uv64[:, 1] / uv64[:, 2] / 256
            flips += int(np.sum(((u32 >= 0) & (v32 >= 0)) != ((u64 >= 0) & (v64 >= 0))))
    assert flips > 0


def test_text_noun_and_modes_of_what_users_get(run: Path) -> None:
    entries = videos(run)
    by_index = {str(i): e for i, e in enumerate(sorted(entries, key=lambda e: e["path"]))}
    for clip, (noun, text) in TEXTS.items():
        entry = next((e for e in entries if e["path"].rsplit(".", 1)[0] == clip), None) or by_index[clip]
        assert (entry["noun"], entry["text"]) == (noun, text)
        assert datasets(run / f"{entry['video_id']}.hdf5")["root/text"] == text
    plain = 0o666 & ~UMASK
    for path in [
        run / "normalization_stats.yaml",
        run / "run_summary.json",
        run / "manifest.json",
        *run.glob("*.hdf5"),
    ]:
        assert stat.S_IMODE(path.stat().st_mode) == plain, f"{path.name} is {oct(path.stat().st_mode)}"
    check = run_script("verify_dataset.py", str(run), "--y2r-strict", env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert check.returncode == 0, check.stdout + check.stderr

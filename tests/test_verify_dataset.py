"""verify_dataset.py: passes on a dataset made by the stages, names every violation it is shown."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from tasks.stages import stage_class
from tasks.statistics.stats import VideoStats, normalization_stats, write_stats_yaml

ROOT = Path(__file__).resolve().parents[1]
from tasks.cli import verify as vd  # noqa: E402


def frames_of(seed: int, T: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:384, 0:512]
    a, b, c = rng.uniform(0.01, 0.03, 3)
    grey = np.stack([127 + 120 * np.sin(a * xx + b * yy + c * t) for t in range(T)])
    return np.repeat(grey[..., None], 3, axis=-1).astype(np.uint8)


def build(out: Path, track_type: str, lengths: tuple[int, ...]) -> None:
    """Write one HDF5 file per clip length with the stages, and the merged statistics."""
    depth, tracks, hands = (stage_class(n)("synthetic") for n in ("depth", "tracks", "hands"))
    h5 = stage_class("h5")(track_type=track_type)
    parts = []
    for i, T in enumerate(lengths):
        frames = frames_of(i, T)
        d = depth.run({"frames": frames})
        tr = tracks.run({"frames": frames, **d})
        ha = hands.run({"frames": frames, "intrinsics": d["intrinsics"], "fps": 10.0})
        inputs = {"frames": frames, "depths": d["depths"], "tracks": tr, "hands": ha, "text": f"clip {i}"}
        parts.append(VideoStats.from_dict(h5.run({**inputs, "out_path": str(out / f"v{i}.hdf5")})["stats"]))
    write_stats_yaml(
        out / "normalization_stats.yaml", normalization_stats(sum(parts, start=VideoStats.empty(track_type)))
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    dirs = {}
    for tt, lengths in (("3d", (14, 12, 6)), ("2d", (12,))):
        dirs[tt] = tmp_path_factory.mktemp(tt)
        build(dirs[tt], tt, lengths)
    return dirs


@pytest.fixture
def ds(built, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(built["3d"], out)
    return out


def edit_yaml(path: Path, **changes) -> None:
    stats = yaml.safe_load(path.read_text())
    stats.update(changes)
    write_stats_yaml(path, stats)


def test_clean_datasets_pass(built) -> None:
    summary: list[str] = []
    assert vd.verify(built["3d"], summary=summary) == []
    assert summary[0].startswith("3 files, 8 windows, ")
    assert vd.verify(built["2d"]) == []
    assert vd.main([str(built["3d"])]) == 0


def test_tolerance_is_relative_1e_9_with_an_absolute_floor(ds: Path) -> None:
    stats = yaml.safe_load((ds / "normalization_stats.yaml").read_text())
    edit_yaml(ds / "normalization_stats.yaml", depth_mean=stats["depth_mean"] * (1 + 1e-11))
    assert vd.verify(ds) == []
    edit_yaml(ds / "normalization_stats.yaml", depth_mean=stats["depth_mean"] * (1 + 1e-8))
    assert [p.split(":")[1].strip().split(" ")[0] for p in vd.verify(ds)] == ["depth_mean[0]"]
    assert vd.close(0.0, 1e-13) and not vd.close(0.0, 1e-11) and vd.close(1e9, 1e9 + 0.5)


def test_counts_keys_and_types_must_match(ds: Path) -> None:
    stats = yaml.safe_load((ds / "normalization_stats.yaml").read_text())
    path = ds / "normalization_stats.yaml"
    edit_yaml(path, pose_num_samples=stats["pose_num_samples"] + 1, extra=1.0)
    problems = vd.verify(ds)
    assert any("pose_num_samples" in p for p in problems) and any("unexpected key extra" in p for p in problems)
    stats.pop("hand_pose_num_samples")
    write_stats_yaml(path, stats)
    assert vd.verify(ds) == ["normalization_stats.yaml: missing key hand_pose_num_samples"]
    path.unlink()
    assert vd.verify(ds) == [f"{path}: missing"]
    assert vd.main([str(ds)]) == 1


def test_contract_violations_in_a_file_are_named(ds: Path) -> None:
    with h5py.File(ds / "v0.hdf5", "a") as f:
        g = f["root/tracks/frame_0000"]
        q = g["query_coords"][()]
        del g["query_coords"]
        g.create_dataset("query_coords", data=q.astype(np.float64))
        f["root/tracks/frame_0001/displacements"][0, 0, 0] = 0.5
        f["root/depth"][0, 0, 0] = 3.0
        del f["root/track_type"]
        f["root"].create_dataset("track_type", data=np.bytes_("3d"))  # fixed-length, not vlen
        f["root/tracks/frame_0002"].create_dataset("left_wrist_query_uvd_extra", data=np.zeros(3, np.float32))
    problems = "\n".join(vd.verify(ds))
    assert "v0.hdf5:tracks/frame_0000: query_coords is float64" in problems
    assert "frame_0001: displacements[0] must be all zeros" in problems
    assert "v0.hdf5: depth has" in problems
    assert "track_type must be a scalar variable-length str dataset" in problems
    assert "unexpected names ['left_wrist_query_uvd_extra']" in problems


def test_hand_datasets_come_as_a_full_set(ds: Path) -> None:
    with h5py.File(ds / "v0.hdf5", "a") as f:
        g = next(f["root/tracks"][k] for k in f["root/tracks"] if "right_wrist_query_uvd" in f["root/tracks"][k])
        del g["right_wrist_rot_displacements"]
    assert any("right hand has" in p for p in vd.verify(ds))


def test_mixed_track_types_and_empty_folders_fail(built, tmp_path: Path) -> None:
    shutil.copytree(built["3d"], tmp_path / "mixed")
    shutil.copy(built["2d"] / "v0.hdf5", tmp_path / "mixed" / "other.hdf5")
    assert "files must share one track_type" in vd.verify(tmp_path / "mixed")[-1]
    (tmp_path / "empty").mkdir()
    assert vd.verify(tmp_path / "empty") == [f"{tmp_path / 'empty'}: no .hdf5 files"]


def test_a_statistics_file_others_cannot_read_is_named(ds: Path) -> None:
    for path in ds.glob("*.hdf5"):
        path.chmod(0o644)
    (ds / "normalization_stats.yaml").chmod(0o600)  # what mkstemp gave before
    problems = vd.verify(ds)
    assert len(problems) == 1 and "mode 0600, but the HDF5 files are 0644" in problems[0], problems
    (ds / "normalization_stats.yaml").chmod(0o644)
    assert vd.verify(ds) == []


@pytest.fixture(scope="module")
def with_work(tmp_path_factory) -> dict[str, Path]:
    """One clip per track type, with the intermediates --y2r-strict reads in OUT/work/<video_id>/."""
    depth, tracks, hands = (stage_class(n)("synthetic") for n in ("depth", "tracks", "hands"))
    frames = frames_of(7, 14)
    d = depth.run({"frames": frames})
    tr = tracks.run({"frames": frames, **d})
    ha = hands.run({"frames": frames, "intrinsics": d["intrinsics"], "fps": 10.0})
    dirs = {}
    for tt in ("3d", "2d"):
        out = dirs[tt] = tmp_path_factory.mktemp(f"strict{tt}")
        (out / "work" / "v0").mkdir(parents=True)
        np.savez(out / "work" / "v0" / "preprocess.npz", frames=frames)
        np.savez(out / "work" / "v0" / "tracks.npz", **{k: v for k, v in tr.items() if k != "quality"})
        inputs = {"frames": frames, "depths": d["depths"], "tracks": tr, "hands": ha, "out_path": str(out / "v0.hdf5")}
        stats = VideoStats.from_dict(stage_class("h5")(track_type=tt).run(inputs)["stats"])
        write_stats_yaml(out / "normalization_stats.yaml", normalization_stats(stats))
    return dirs


def strict_copy(with_work: dict[str, Path], tt: str, tmp_path: Path) -> Path:
    out = tmp_path / tt
    shutil.copytree(with_work[tt], out)
    return out


@pytest.mark.parametrize("tt", ["3d", "2d"])
def test_y2r_strict_passes_on_the_stages_output(with_work, tt: str) -> None:
    assert vd.verify(with_work[tt], y2r_strict=True) == []
    assert vd.main([str(with_work[tt]), "--y2r-strict"]) == 0


def test_y2r_strict_names_pixels_intrinsics_and_point_counts_off_y2r(with_work, tmp_path: Path) -> None:
    out = strict_copy(with_work, "3d", tmp_path)
    with h5py.File(out / "v0.hdf5", "r+") as f:
        f["root/video"][0, 0, 0, 0] ^= 1
        K = f["root/intrinsics"][()]
        K[0, 0] = np.nextafter(K[0, 0], np.float32(0))  # one float32 step, as a float64 computation gives
        f["root/intrinsics"][...] = K
        g = f["root/tracks/frame_0000"]
        q, disp = g["query_coords"][()], g["displacements"][()]
        del g["query_coords"], g["displacements"]
        g["query_coords"], g["displacements"] = q[1:], disp[:, 1:]
    assert vd.verify(out) != []  # the statistics no longer match the files either
    problems = [p for p in vd.verify(out, y2r_strict=True) if "y2r" in p or "INTER_LANCZOS4" in p]
    assert any("video is not cv2 INTER_LANCZOS4" in p for p in problems), problems
    assert any("are not y2r's float32 steps" in p for p in problems), problems
    assert any(f"window 0 keeps {len(q) - 1} points, y2r's 3d rule keeps {len(q)}" in p for p in problems), problems


def test_y2r_strict_refuses_an_empty_2d_window(with_work, tmp_path: Path) -> None:
    out = strict_copy(with_work, "2d", tmp_path)
    with h5py.File(out / "v0.hdf5", "r+") as f:
        g = f["root/tracks/frame_0000"]
        q, disp = g["query_coords"][()], g["displacements"][()]
        del g["query_coords"], g["displacements"]
        g["query_coords"], g["displacements"] = q[:0], disp[:, :0]
    problems = vd.verify(out, y2r_strict=True)
    assert any("window 0 is empty; y2r writes no group" in p for p in problems), problems

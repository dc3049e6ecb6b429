"""Write one video of a dataset as a Rerun recording (.rrd): frames, depth, camera poses, 3D tracks, hand joints.

    framefleet view OUT [VIDEO] [--rrd FILE] [--open]

VIDEO is a video id, its HDF5 file's name or its path under RAW_DIR (default: the first
file). With the video's intermediates in OUT/work/<video>/ (``--intermediates keep``, the
default) everything is in one world frame: each camera at its pose, the tracks of the window
starting at each frame along their whole window, the hands' joints. Without them, only the
HDF5 file is read: its 256x256 frames and depth, and each window's tracks in that window's
first camera. Needs the ``view`` extra (``pip install 'framefleet[view]'``, rerun-sdk);
``--open`` starts the Rerun viewer on the file when one is installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tasks.cli import common
from tasks.outputs import buckets
from tasks.outputs.preview import BONES
from tasks.outputs.stage_io import output_path
from tasks.records import lineage
from tasks.stages import DepthStage, HandsStage, PreprocessStage, TracksStage

SIDES = ("left", "right")
COLOURS = {"left": (80, 160, 255), "right": (255, 120, 60)}


def find_video(out_dir: Path, video: str | None) -> str:
    """The video id of ``video`` (an id, a file name or a path under RAW_DIR) in ``out_dir``; raises ValueError."""
    ids = sorted(p.stem for p in out_dir.glob("*.hdf5"))
    if not ids:
        raise ValueError(f"{out_dir} holds no .hdf5 files; name the output folder of a finished run")
    if video is None:
        return ids[0]
    name = Path(video).name.removesuffix(".hdf5")
    if name in ids:
        return name
    for entry in lineage.read(out_dir).get("videos", []):
        if entry.get("path") == video and entry["video_id"] in ids:
            return str(entry["video_id"])
    raise ValueError(f"no video {video!r} in {out_dir}; its videos are {', '.join(ids[:10])}")


def _npz(path: Path) -> dict[str, np.ndarray] | None:
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def log_intermediates(rec: Any, out_dir: Path, video_id: str) -> bool:
    """Log the video from its intermediates in world coordinates; False when they are not there."""
    import rerun as rr

    def output(stage: Any) -> dict[str, np.ndarray] | None:
        return _npz(output_path(out_dir, video_id, stage.name))

    frames, depth = output(PreprocessStage), output(DepthStage)
    if frames is None or depth is None:
        return False
    tracks, hands = output(TracksStage), output(HandsStage)
    E = np.asarray(depth["extrinsics"], np.float64)  # world -> camera
    cam_to_world = np.linalg.inv(E)
    T, H, W = frames["frames"].shape[:3]
    windows = {int(s): w for w, s in enumerate(tracks["window_starts"])} if tracks is not None else {}
    rec.log("world", rr.ViewCoordinates.RDF, static=True)
    for t in range(T):
        rec.set_time("frame", sequence=t)
        c2w = cam_to_world[t]
        rec.log("world/camera", rr.Transform3D(translation=c2w[:3, 3], mat3x3=c2w[:3, :3]))
        rec.log("world/camera/image", rr.Pinhole(image_from_camera=depth["intrinsics"][t], width=W, height=H))
        rec.log("world/camera/image/rgb", rr.Image(frames["frames"][t]))
        rec.log("world/camera/image/depth", rr.DepthImage(np.asarray(depth["depths"][t], np.float32), meter=1.0))
        if t in windows and tracks is not None:
            w = windows[t]
            n = int(tracks["num_points"][w])
            local = np.asarray(tracks["tracks"][w, :, :n], np.float64)  # (L, n, 3) in camera s = t
            world = local @ c2w[:3, :3].T + c2w[:3, 3]
            strips = [p[np.isfinite(p).all(axis=1)] for p in world.transpose(1, 0, 2)]
            rec.log("world/tracks", rr.LineStrips3D([s for s in strips if len(s) > 1]))
            rec.log("world/tracks/queries", rr.Points3D(world[0][np.isfinite(world[0]).all(axis=1)], radii=0.005))
        for side in SIDES:
            if hands is None or not bool(hands[f"{side}_valid"][t]):
                rec.log(f"world/hands/{side}", rr.Clear(recursive=True))
                continue
            joints = np.asarray(hands[f"{side}_joints_3d"][t], np.float64) @ c2w[:3, :3].T + c2w[:3, 3]
            rec.log(f"world/hands/{side}/joints", rr.Points3D(joints, colors=COLOURS[side], radii=0.006))
            rec.log(
                f"world/hands/{side}/bones", rr.LineStrips3D([joints[[a, b]] for a, b in BONES], colors=COLOURS[side])
            )
    return True


def log_hdf5(rec: Any, path: Path) -> None:
    """Log what the HDF5 file holds: frames, depth, and each window's tracks in its first camera."""
    import h5py
    import rerun as rr

    with h5py.File(path, "r") as f:
        root = f["root"]
        video = root["video"][()]
        K = root["intrinsics"][()] if "intrinsics" in root else None
        depth = root["depth"][()] if "depth" in root else None
        S = video.shape[-1]
        rec.log("camera", rr.ViewCoordinates.RDF, static=True)
        if K is not None:
            rec.log("camera/image", rr.Pinhole(image_from_camera=K, width=S, height=S), static=True)
        for t in range(len(video)):
            rec.set_time("frame", sequence=t)
            rec.log("camera/image/rgb", rr.Image(video[t].transpose(1, 2, 0)))
            if depth is not None and t < len(depth):
                rec.log("camera/image/depth", rr.DepthImage(depth[t], meter=1.0))
            group = root.get(f"tracks/frame_{t:04d}")
            if group is None or K is None or group["query_coords"].shape[-1] != 3:
                continue
            uvd = group["query_coords"][()][None] + group["displacements"][()]  # (L, N, 3)
            pixels = uvd[..., :2] * S
            rays = np.concatenate([pixels, np.ones_like(pixels[..., :1])], axis=-1) @ np.linalg.inv(K).T
            points = rays * uvd[..., 2:3]
            rec.log("camera/tracks", rr.LineStrips3D(list(points.transpose(1, 0, 2))))


def write_rrd(out_dir: Path, video_id: str, rrd: Path) -> str:
    """Write ``video_id`` of ``out_dir`` to ``rrd``; return what was logged ("world" or "hdf5")."""
    try:
        import rerun as rr
    except ImportError as exc:
        raise RuntimeError(
            f"framefleet view needs rerun-sdk ({exc}); install it with: pip install 'framefleet[view]'"
        ) from exc
    rec = rr.RecordingStream(f"framefleet-{video_id}")
    rec.save(str(rrd))
    try:
        kind = "world" if log_intermediates(rec, out_dir, video_id) else "hdf5"
        if kind == "hdf5":
            log_hdf5(rec, out_dir / f"{video_id}.hdf5")
        rec.flush()
    finally:
        rec.disconnect()
    return kind


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=common.HelpFormatter)
    parser.add_argument("out", type=buckets.data_root_arg, metavar="OUT", help="a dataset's output folder")
    parser.add_argument("video", nargs="?", metavar="VIDEO", help="video id, HDF5 name or path under RAW_DIR")
    parser.add_argument("--rrd", type=Path, metavar="FILE", help="where to write (default OUT/<video>.rrd)")
    parser.add_argument("--open", action="store_true", help="start the Rerun viewer on the file")
    args = parser.parse_args(argv)
    try:
        vid = find_video(args.out, args.video)
        rrd = args.rrd or args.out / f"{vid}.rrd"
        kind = write_rrd(args.out, vid, rrd)
    except (ValueError, RuntimeError, OSError) as exc:
        return common.fail(str(exc))
    what = "in world coordinates (from OUT/work/)" if kind == "world" else "from the HDF5 file only"
    print(f"wrote {rrd} ({what}); open it with: rerun {rrd}")
    if args.open:
        viewer = shutil.which("rerun")
        if viewer is None:
            return common.fail("no Rerun viewer on PATH (it comes with rerun-sdk); open the file elsewhere")
        subprocess.Popen([viewer, str(rrd)], start_new_session=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

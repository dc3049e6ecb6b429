#!/usr/bin/env python3
"""Parity figures: framefleet's h5 files against y2r's writer (tests/y2r_oracle.py) on the same intermediates.

    python bench/parity.py RAW_DIR [--code TREE]

Runs the five stages in-process (synthetic backends) on every video of RAW_DIR with the code
of TREE (default: this checkout; pass an exported older commit for the "before" figures),
writes the 3D and the 2D file of each video, feeds y2r's writer, re-stated in
tests/y2r_oracle.py, the very same intermediates, and prints one JSON object of counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw_dir", type=Path)
    parser.add_argument("--code", type=Path, default=HERE, help="the framefleet tree whose stages run")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.code.resolve()))
    import cv2
    import h5py
    import numpy as np

    from tasks.run.dataset import find_videos
    from tasks.stages import stage_class

    spec = importlib.util.spec_from_file_location("y2r_oracle", HERE / "tests" / "y2r_oracle.py")
    oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oracle)

    stages = {n: stage_class(n)() for n in ("preprocess", "depth", "tracks", "hands")}
    h5 = {tt: stage_class("h5")(track_type=tt) for tt in ("3d", "2d")}
    fig = {"videos": 0, "frames": 0, "pixel_values": 0, "pixel_values_differing": 0, "pixel_max_diff": 0}
    for tt in ("3d", "2d"):
        fig[tt] = {"windows": 0, "windows_y2r": 0, "windows_with_other_count": 0, "points": 0, "points_y2r": 0}
    fx = None
    for video in find_videos(args.raw_dir):
        pre = stages["preprocess"].run({"video_path": str(video)})
        depth = stages["depth"].run({"frames": pre["frames"]})
        tracks = stages["tracks"].run({"frames": pre["frames"], **depth})
        hands = stages["hands"].run({"frames": pre["frames"], "intrinsics": depth["intrinsics"][0], "fps": 10.0})
        with tempfile.TemporaryDirectory() as tmp:
            pngs = []
            for i, frame in enumerate(pre["frames"]):
                pngs.append(Path(tmp) / f"{i:05d}.png")
                cv2.imwrite(str(pngs[-1]), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
            for tt in ("3d", "2d"):
                inputs = {"frames": pre["frames"], "depths": depth["depths"], "tracks": tracks, "hands": hands}
                h5[tt].run({**inputs, "text": "", "out_path": f"{tmp}/{tt}.hdf5"})
                want, _ = oracle.process_video(
                    pngs, y2r_tracks(tracks, tt, np), tt, depths_f16=depth["depths"], hand_data=hands
                )
                with h5py.File(f"{tmp}/{tt}.hdf5") as f:
                    ours = {k: len(g["query_coords"]) for k, g in f["root/tracks"].items()}
                    if tt == "3d":
                        video_ours = f["root/video"][()]
                        fx = fx or (float(f["root/intrinsics"][0, 0]), float(want["root/intrinsics"][0, 0]))
                theirs = {k.split("/")[2]: len(v) for k, v in want.items() if k.endswith("/query_coords")}
                f2 = fig[tt]
                f2["windows"] += len(ours)
                f2["windows_y2r"] += len(theirs)
                starts = set(ours) | set(theirs)
                f2["windows_with_other_count"] += sum(ours.get(k, -1) != theirs.get(k, -1) for k in starts)
                f2["points"] += sum(ours.values())
                f2["points_y2r"] += sum(theirs.values())
        diff = np.abs(video_ours.astype(np.int16) - want["root/video"].astype(np.int16))
        fig["videos"] += 1
        fig["frames"] += len(pre["frames"])
        fig["pixel_values"] += diff.size
        fig["pixel_values_differing"] += int((diff > 0).sum())
        fig["pixel_max_diff"] = max(fig["pixel_max_diff"], int(diff.max()))
    for tt in ("3d", "2d"):
        fig[tt]["displacement_num_samples"] = fig[tt]["points"] * 10
        fig[tt]["displacement_num_samples_y2r"] = fig[tt]["points_y2r"] * 10
    fig["fx_ours_y2r"] = fx
    print(json.dumps(fig, indent=1))
    return 0


def y2r_tracks(tracks: dict, tt: str, np) -> dict:
    """The TAPIP3D dict y2r reads, or for 2D the CoTracker one: the 3D tracks seen by the frame's camera."""
    out = {"windows": [], "tracks": [], "window_poses": [], "intrinsics": tracks["intrinsics"]}
    K = np.asarray(tracks["intrinsics"], dtype=np.float32)
    for w, s in enumerate(tracks["window_starts"].tolist()):
        pts = np.ascontiguousarray(tracks["tracks"][w, :, : int(tracks["num_points"][w])], dtype=np.float32)
        if tt == "2d":
            pix = np.full(pts.shape[:-1] + (2,), np.nan, dtype=np.float32)
            with np.errstate(divide="ignore", invalid="ignore"):
                for t, step in enumerate(pts):
                    uv = (K @ step.T).T
                    front = step[:, 2] > 0
                    pix[t, front, 0] = (uv[:, 0] / uv[:, 2])[front]
                    pix[t, front, 1] = (uv[:, 1] / uv[:, 2])[front]
            pts = pix
        out["windows"].append((s, s + len(pts)))
        out["tracks"].append(pts[None])
        out["window_poses"].append(tracks["window_poses"][w])
    return out


if __name__ == "__main__":
    sys.exit(main())

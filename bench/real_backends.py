"""Time the real CPU backends per frame on the real clips and count what they found.

    python bench/real_backends.py [CLIP_DIR] [--threads 2]

CLIP_DIR holds dog.mp4, sheep.mp4 and pstudio.mp4 (default: $FRAMEFLEET_REAL_DATA, else shared/data/real beside
the repository).

For each clip (after preprocess: 10 fps, 512x384): the classical depth backend's ms per frame and
frames posed; the opencv tracks stage's ms per frame and points kept per window (finite on all
10 steps, of the 64 queried); the mediapipe hands stage's ms per frame and frames with a hand
(before and after the velocity filter and gap filling). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np

from tasks.stages.depth import DepthStage
from tasks.stages.hands import HandsStage
from tasks.stages.preprocess import PreprocessStage
from tasks.stages.tracks import TracksStage

CLIPS = ("pstudio.mp4", "dog.mp4", "sheep.mp4")


def timed(fn, *args):
    """Return fn's result and (wall seconds, CPU seconds of this process): on a shared machine the CPU time is
    what the backend costs, the wall time what it took amid the other load."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, (time.perf_counter() - t0, time.process_time() - c0)


def default_clips() -> Path | None:
    """$FRAMEFLEET_REAL_DATA, else shared/data/real beside the repository or a folder above it, if there."""
    if os.environ.get("FRAMEFLEET_REAL_DATA"):
        return Path(os.environ["FRAMEFLEET_REAL_DATA"])
    root = Path(__file__).resolve().parents[1]
    return next((p / "shared/data/real" for p in root.parents if (p / "shared/data/real").is_dir()), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("clips", nargs="?", type=Path, default=default_clips())
    ap.add_argument("--threads", type=int, default=2, help="OpenCV threads (this machine: 2 cores)")
    args = ap.parse_args()
    if args.clips is None or not all((args.clips / name).is_file() for name in CLIPS):
        names = ", ".join(CLIPS)
        ap.error(f"the real clips ({names}) are not in {args.clips}: name their folder, or set FRAMEFLEET_REAL_DATA")
    import cv2

    cv2.setNumThreads(args.threads)
    pre, depth = PreprocessStage(), DepthStage(backend="classical")
    tracks, hands = TracksStage(backend="opencv"), HandsStage(backend="mediapipe")
    for stage in (pre, depth, tracks, hands):
        stage.load("cpu")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, OpenCV {cv2.__version__}, "
        f"{args.threads} OpenCV threads"
    )
    print(f"load average at start: {os.getloadavg()[0]:.1f}; ms/frame as wall (CPU of this process)")
    print(
        "| clip | frames | depth ms/frame | camera | frames posed | reproj. px | tracks ms/frame | points kept "
        "per window (median, of 64) | hands ms/frame | frames with a hand (raw / after filter) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in CLIPS:
        p = pre.run({"video_path": str(args.clips / name)})
        frames = p["frames"]
        T = len(frames)
        d, t_depth = timed(depth.run, {"frames": frames})
        notes = d.pop("notes", {})
        tr, t_tracks = timed(
            tracks.run, {"frames": frames, **{k: d[k] for k in ("depths", "intrinsics", "extrinsics")}}
        )
        kept = [
            int(np.isfinite(tr["tracks"][w, :, : tr["num_points"][w]]).all(axis=(0, 2)).sum())
            for w in range(len(tr["window_starts"]))
        ]
        raw = {}
        original = hands.model.detect

        def spy(*a, _original=original, _raw=raw, **k):
            _raw.update(_original(*a, **k))  # the detections before the stage's filter
            return _raw

        hands.model.detect = spy
        h, t_hands = timed(
            hands.run,
            {"frames": frames, "intrinsics": d["intrinsics"][0], "fps": float(p["fps"]), "depths": d["depths"]},
        )
        hands.model.detect = original
        found_raw = int((raw["left"]["valid"] | raw["right"]["valid"]).sum())
        found = int((h["left_valid"] | h["right_valid"]).sum())
        reproj = notes.get("median_reprojection_error_px", "-")

        def ms(t: tuple[float, float], frames: int = T) -> str:
            return f"{1000 * t[0] / frames:.0f} ({1000 * t[1] / frames:.0f})"

        print(
            f"| {name} | {T} | {ms(t_depth)} | {notes['camera']} | {notes['frames_posed']}/{T} | {reproj} "
            f"| {ms(t_tracks)} | {np.median(kept) if kept else 0:.0f} | {ms(t_hands)} "
            f"| {found_raw}/{T} / {found}/{T} |"
        )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Cut real clips into short videos for a run of many: consecutive segments, one of each clip in turn, until COUNT.

    python bench/real_segments.py SRC_DIR OUT_DIR [--seconds 2] [--count 24]

Each segment keeps its clip's size and frame rate (H.264, every frame re-encoded); a clip gives
floor(duration / seconds) segments, and when all of them together are fewer than COUNT, the clips are
cut again from half a segment in. ../shared/data/real's three clips (dog 4 s, sheep 12 s, pstudio 30 s)
give 23 two-second segments, then more from the offset pass; COUNT 16 takes 2 of dog, 6 of sheep, 8 of
pstudio. The videos a GPU run of the real models works on (bench/gpu_full_chain.sh): real content, a length
that ViPE's SLAM starts on.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from fractions import Fraction
from pathlib import Path

import av


def frames_of(clip: Path) -> tuple[list[object], Fraction]:
    """Every frame of ``clip`` as RGB arrays, and its frame rate."""
    with av.open(str(clip)) as box:
        stream = box.streams.video[0]
        rate = Fraction(stream.average_rate or 10)
        return [f.to_ndarray(format="rgb24") for f in box.decode(stream)], rate


def write(path: Path, frames: list[object], rate: Fraction) -> None:
    with av.open(str(path), "w") as box:
        stream = box.add_stream("libx264", rate=rate)
        height, width = frames[0].shape[:2]  # type: ignore[attr-defined]
        stream.width, stream.height, stream.pix_fmt = width - width % 2, height - height % 2, "yuv420p"
        for array in frames:
            frame = av.VideoFrame.from_ndarray(array[: stream.height, : stream.width], format="rgb24")  # type: ignore[index]
            box.mux(stream.encode(frame))
        box.mux(stream.encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--count", type=int, default=24)
    args = parser.parse_args(argv)
    clips = sorted(args.src.glob("*.mp4"))
    if not clips:
        parser.error(f"no .mp4 in {args.src}")
    args.out.mkdir(parents=True, exist_ok=True)
    decoded = {clip.stem: frames_of(clip) for clip in clips}
    written = 0
    for offset in (0.0, 0.5):  # the offset pass only once every clip's first pass is used
        cuts = []  # per clip, its segments: (name, frames, frames a segment, rate, first frame)
        for name, (frames, rate) in decoded.items():
            n = round(args.seconds * rate)
            firsts = range(round(offset * n), len(frames) - n + 1, n)
            cuts.append([(f"{name}_{'ab'[offset > 0]}{k:02d}", frames, n, rate, i) for k, i in enumerate(firsts)])
        for turn in itertools.zip_longest(*cuts):  # one segment of each clip in turn: a mix of all of them
            for name, frames, n, rate, first in (c for c in turn if c is not None):
                if written < args.count:
                    write(args.out / f"{name}.mp4", frames[first : first + n], rate)
                    written += 1
    print(f"{written} videos of {args.seconds} s in {args.out}")
    return 0 if written == args.count else 1


if __name__ == "__main__":
    sys.exit(main())

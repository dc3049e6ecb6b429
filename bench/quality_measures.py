"""What the default chain's stages measure (their ``quality``) on clips, in one process, with no config: the
numbers the default quality gates were chosen from (docs/operations-defaults.md).

Usage: PYTHONPATH=. python bench/quality_measures.py CLIP [CLIP ...]
       PYTHONPATH=. python bench/quality_measures.py --synthetic DIR   # writes DIR/wall.mp4 and DIR/one.mp4 first
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import av
import numpy as np

from tasks.job import Job
from tasks.stages import build, stage_class
from worker_config.settings import Settings


def write(path: Path, frames: list[np.ndarray], fps: int = 10) -> Path:
    """Write ``frames`` (H, W, 3) uint8 as H.264 at ``fps``."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def synthetic(folder: Path) -> list[Path]:
    """A featureless still wall (30 frames of one grey) and a 1-frame video of noise."""
    folder.mkdir(parents=True, exist_ok=True)
    noise = np.random.default_rng(0).integers(0, 255, (384, 512, 3), dtype=np.uint8)
    return [
        write(folder / "wall.mp4", [np.full((384, 512, 3), 128, np.uint8)] * 30),
        write(folder / "one.mp4", [noise]),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=__doc__.split("Usage: ")[1])
    parser.add_argument("--synthetic", type=Path, metavar="DIR", help="write DIR/wall.mp4 and DIR/one.mp4 first")
    parser.add_argument("clips", type=Path, nargs="*", metavar="CLIP")
    args = parser.parse_args(argv)
    clips = (synthetic(args.synthetic) if args.synthetic else []) + list(args.clips)
    conf = Settings()
    stages = {}
    for name in conf.enabled_stages():
        if stage_class(name).writes != "hdf5":
            stages[name] = build(name, conf.stages[name])
            stages[name].load("cpu")
    print("backends:", {name: conf.stages[name].backend for name in stages})
    for path in clips:
        job = Job.from_dict(
            {
                "run_id": "r",
                "video_id": path.stem,
                "video": path.name,
                "dataset_root": str(path.parent),
                "output_root": ".",
            }
        )
        outputs: dict[str, dict] = {}
        measured = {}
        began = time.perf_counter()
        for name, stage in stages.items():
            out = stage.run(type(stage).select_inputs(outputs, job))
            measured[name] = out.pop("quality", None)
            outputs[name] = out
        frames = len(outputs[next(iter(stages))]["frames"])
        print(path.name, frames, "frames", f"{time.perf_counter() - began:.1f} s", json.dumps(measured))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

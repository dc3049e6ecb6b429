#!/usr/bin/env python3
"""The compute bound of the GPU stages: the same model calls on inputs already in memory, in a tight loop.

    python bench/gpu_bound.py RAW_DIR [--device cuda:0] [--limit N]   (settings from $FRAMEFLEET_CONFIG)

Preprocess runs first on the CPU, untimed; then every GPU stage's ``run`` is called for every
video one after another with its inputs taken from memory (no npz, no queue, no Celery). Prints
one JSON line: seconds of the timed loop, frames, and seconds per stage.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw_dir", type=Path)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--limit", type=int)
    args = parser.parse_args(argv)

    from bench.modes_local import jobs_for
    from tasks.celery_app import settings
    from tasks.job import Job
    from tasks.stages import GPU_STAGES, build, source_stage, stage_class

    conf = settings()
    jobs = [Job.from_dict(j) for j in jobs_for(args.raw_dir.resolve(), Path(tempfile.mkdtemp()), args.limit)]
    chain = jobs[0].chain
    gpu = [s for s in chain if s in GPU_STAGES]
    first = source_stage()
    pre = build(first.name, conf.stages[first.name])
    outputs: list[dict[str, Any]] = []
    for job in jobs:  # untimed: the frames every GPU stage starts from
        arrays = pre.run(first.select_inputs({}, job))
        arrays.pop("notes", None)
        outputs.append({first.name: arrays})
    stages = {}
    for name in gpu:
        stages[name] = build(name, conf.stages[name])
        stages[name].load(args.device)
    per_stage = dict.fromkeys(gpu, 0.0)
    frames = sum(len(o[first.name]["frames"]) for o in outputs)
    import torch

    on_gpu = args.device.startswith("cuda")
    if on_gpu:
        torch.cuda.synchronize()
    began = time.perf_counter()
    for job, done in zip(jobs, outputs, strict=True):
        for name in gpu:
            t = time.perf_counter()
            arrays = stages[name].run(stage_class(name).select_inputs(done, job))
            arrays.pop("notes", None)
            done[name] = arrays
            per_stage[name] += time.perf_counter() - t
    if on_gpu:
        torch.cuda.synchronize()
    print(
        json.dumps(
            {
                "bound_s": time.perf_counter() - began,
                "videos": len(jobs),
                "frames": frames,
                "per_stage_s": per_stage,
                "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

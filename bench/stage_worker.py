#!/usr/bin/env python3
"""One model stage in a process of its own, outside Celery: load it once, then run the jobs read from stdin.

    python bench/stage_worker.py STAGE [--device cuda:0] [--save]   (settings from $FRAMEFLEET_CONFIG)

Run it with the stage's own interpreter (``stages.<stage>.python``), as a worker of that stage runs.
stdin: one job per line (JSON, as the enqueuer builds it); a stage's inputs are read from the job's
``output_root`` as a worker reads them (untimed); ``--save`` writes its outputs there too (untimed), for
the next stage. stdout carries JSON lines only: ``{"event": "loaded", "load_s": ...}``, then per job
``{"event": "done", "video": ..., "run_s": ..., "torch_peak_reserved_mib": ...}``; whatever the
libraries print goes to stderr. An error ends the process with status 1 (the pool of old had no
handling either); end of input ends it with 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--save", action="store_true", help="write the outputs under each job's output_root")
    args = parser.parse_args(argv)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # libraries that print must not break the protocol

    from tasks.celery_app import settings
    from tasks.job import Job
    from tasks.outputs.stage_io import UPSTREAM_KEY, gather_inputs, output_path
    from tasks.outputs.storage import save_npz
    from tasks.stages import build

    def say(**event: object) -> None:
        proto.write(json.dumps(event) + "\n")

    conf = settings()
    began = time.perf_counter()
    stage = build(args.stage, conf.stages[args.stage])
    stage.load(args.device)
    cuda = args.device.startswith("cuda")
    torch = None
    if cuda:
        import torch

        torch.cuda.synchronize()
    say(event="loaded", stage=args.stage, load_s=round(time.perf_counter() - began, 3), pid=os.getpid())
    for line in sys.stdin:
        if not line.strip():
            continue
        job = Job.from_dict(json.loads(line))
        inputs = gather_inputs(args.stage, job, tuple(job.chain))
        inputs.pop(UPSTREAM_KEY, None)
        t = time.perf_counter()
        arrays = stage.run(inputs)
        if torch is not None:
            torch.cuda.synchronize()
        run_s = time.perf_counter() - t
        arrays.pop("notes", None)
        arrays.pop("quality", None)
        if args.save:
            path = output_path(Path(job.output_root), job.video_id, args.stage)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_npz(path, arrays)
        peak = round(torch.cuda.max_memory_reserved() / 2**20, 1) if torch is not None else None
        say(event="done", stage=args.stage, video=job.video_id, run_s=round(run_s, 4), torch_peak_reserved_mib=peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())

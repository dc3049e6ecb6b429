#!/usr/bin/env python3
"""What the run check adds per message (tasks.pipeline.admission, tasks.run.seal): microseconds a job.

    python bench/admission_cost.py [--jobs 20000] [--rounds 5]

Measures, on a real OUT in a temporary folder: the enqueuer's seal of one video's job (``Sealer.seal``, the
run's shared part hashed once); a worker's check of a job of a run it has read already (one ``stat`` of the
record, the video id from its path, the HMAC, compared in constant time); the first job of a run in a worker
(the record and the key read); and, for scale, ``Job.from_dict`` plus the schema check every job met before.
Prints the median of ``--rounds`` rounds of ``--jobs`` jobs each, in µs a job.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def per_job_us(call, jobs: int, rounds: int) -> float:  # type: ignore[no-untyped-def]
    """The median over ``rounds`` of the µs ``call(i)`` takes, i in 0..jobs-1."""
    found = []
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(jobs):
            call(i)
        found.append((time.perf_counter() - start) / jobs * 1e6)
    return statistics.median(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    from tasks.job import Job
    from tasks.job_check import check_job
    from tasks.pipeline import admission
    from tasks.run import runs, seal
    from tasks.run.dataset import video_id_of
    from tasks.stages import STAGE_NAMES
    from tasks.workers import confinement
    from worker_config.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        raw, out = Path(tmp) / "raw", Path(tmp) / "out"
        raw.mkdir()
        (raw / "camera_00").mkdir()
        (raw / "camera_00" / "episode_00001_take1.mp4").write_bytes(b"x")
        run_id = "20261129-060000-abcdef"
        key = seal.create(out, run_id)
        runs.write(out, {"run_id": run_id, "raw_dir": str(raw), "output_root": str(out), "status": "running"})
        path = "camera_00/episode_00001_take1.mp4"
        shared = Job(
            run_id, "", "", str(raw), str(out), chain=tuple(STAGE_NAMES), settings={s: "a" * 64 for s in STAGE_NAMES}
        )
        sealer = seal.Sealer(key, shared)
        job = dataclasses.replace(shared, video_id=video_id_of(path), video=path, text="pick up the cup")
        job = dataclasses.replace(job, seal=seal.seal_of(key, job))
        wire = job.to_dict()
        conf = Settings(unrecorded_runs=False)
        confinement.STATE["worker"] = True

        def first(_i: int) -> None:
            admission._READ.clear()
            admission.check(job, conf)

        rows = [
            (
                "enqueue: seal a video's job",
                per_job_us(lambda i: sealer.seal(f"v{i}", path, "t", ""), args.jobs, args.rounds),
            ),
            (
                "worker: check a job, run read already",
                per_job_us(lambda _i: admission.check(job, conf), args.jobs, args.rounds),
            ),
            (
                "worker: the first job of a run (record and key read)",
                per_job_us(first, max(args.jobs // 10, 1), args.rounds),
            ),
            (
                "for scale: Job.from_dict and the schema check",
                per_job_us(lambda _i: check_job(Job.from_dict(wire), "depth", STAGE_NAMES), args.jobs, args.rounds),
            ),
        ]
    for what, us in rows:
        print(f"{what:<56} {us:8.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

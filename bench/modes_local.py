"""The two baselines without a queue, on framefleet's own stage code (``tasks.pipeline._execute``).

- ``sequential``: one process, every model loaded once, the stages of each video one after another.
- ``pool``: the predecessor's pattern: per stage, a pool of processes spawned per worker slot,
  each loading its model, the videos handed out round-robin; the next stage starts when every
  slot of this one is done.

Each returns the spans of every (video, stage): start and end (epoch s), seconds in the
stage's own ``run`` (the model) and who ran it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any


def jobs_for(raw_dir: Path, out_dir: Path, limit: int | None = None, run_id: str = "bench") -> list[dict[str, Any]]:
    """The job message of every video of ``raw_dir``, as the enqueuer builds it (tasks.run.dataset.build_jobs)."""
    from tasks.celery_app import settings
    from tasks.run.dataset import find_videos, video_id

    order = list(settings().enabled_stages())
    jobs = []
    for video in find_videos(raw_dir)[: limit or None]:
        rel = video.relative_to(raw_dir)
        jobs.append(
            {
                "run_id": run_id,
                "video_id": video_id(rel),
                "video": rel.as_posix(),
                "dataset_root": str(raw_dir.resolve()),
                "output_root": str(out_dir.resolve()),
                "gpus": None,
                "gpu": None,
                "force": False,
                "text": "",
                "chain": order,
            }
        )
    return jobs


def run_one(stage: str, job: dict[str, Any], who: str) -> dict[str, Any]:
    """Run ``stage`` of ``job`` through framefleet's stage code; return its span."""
    from tasks.job import Job
    from tasks.pipeline.execute import execute
    from tasks.pipeline.hooks import StageCall

    start = time.time()
    given = Job.from_dict(job)
    report = execute(StageCall(None, stage, given=given, job=given))  # type: ignore[arg-type]  (no task: no hooks)
    return {
        "video": job["video_id"],
        "stage": stage,
        "start": start,
        "end": time.time(),
        "run_s": report.get("run_s", 0.0),
        "worker": who,
    }


def preload(stages: list[str]) -> None:
    """Load each stage's model once in this process, as a worker does at start (torch threads as the settings say)."""
    from tasks.celery_app import settings
    from tasks.workers import worker

    if settings().torch_threads:
        import torch

        torch.set_num_threads(settings().torch_threads)
    for stage in stages:
        worker.load_stage(stage, "cpu")


def sequential(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    preload(jobs[0]["chain"])
    return [run_one(stage, job, "main") for job in jobs for stage in job["chain"]]


def _slot(stage: str, jobs: list[dict[str, Any]], queue: Any) -> None:
    preload([stage])
    queue.put([run_one(stage, job, f"slot{os.getpid()}") for job in jobs])


def pool(jobs: list[dict[str, Any]], slots: int) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    spans: list[dict[str, Any]] = []
    for stage in jobs[0]["chain"]:
        queue = ctx.Queue()
        procs = [ctx.Process(target=_slot, args=(stage, jobs[i::slots], queue)) for i in range(slots)]
        for p in procs:
            p.start()
        for _ in procs:
            spans += queue.get()
        for p in procs:
            p.join()
            if p.exitcode:
                raise RuntimeError(f"a {stage} slot exited with status {p.exitcode}")
    return spans

"""The job messages the benchmarks send, built as framefleet's enqueuer builds them (``jobs_for``).

Not a benchmark of its own: bench/real_chain.py, gpu_bound.py and stage_pool.py import it. (Its former
``sequential`` and ``pool`` baselines, run by bench/compare.py, are kept by git:
``git show b08a959:bench/modes_local.py``.)
"""

from __future__ import annotations

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

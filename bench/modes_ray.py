"""Ray Data on framefleet's stage code, both ways (needs the ``bench`` extra: ``pip install -e '.[bench]'``).

- ``ray-stages``: one ``map`` per stage, each with a pool of actors that load that stage's model;
- ``ray-fused``: one ``map`` whose actors load every model and run the whole chain per video.

Rows carry the job as JSON (Arrow has no type for its nulls and lists) and the spans so far.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


class StageActor:
    """A Ray Data map actor that runs the stages ``stages`` of each row's video in turn."""

    def __init__(self, stages: list[str]) -> None:
        from bench.modes_local import preload

        self.stages = stages
        preload(stages)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        from bench.modes_local import run_one

        job, spans = json.loads(row["job"]), json.loads(row["spans"])
        for stage in self.stages:
            spans.append(run_one(stage, job, f"ray{os.getpid()}"))
        return {"job": row["job"], "spans": json.dumps(spans)}


def run(jobs: list[dict[str, Any]], fused: bool, cores: int) -> dict[str, Any]:
    import ray

    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = False
        ctx.enable_progress_bars = False
        began = time.time()
        ds = ray.data.from_items([{"job": json.dumps(j), "spans": "[]"} for j in jobs], override_num_blocks=len(jobs))
        chain = jobs[0]["chain"]
        if fused:
            ds = ds.map(StageActor, fn_constructor_kwargs={"stages": chain}, concurrency=cores, num_cpus=1)
        else:
            # Every stage gets a pool as large as the machine; the pools share the cores.
            share = 1.0 / len(chain)
            for stage in chain:
                ds = ds.map(StageActor, fn_constructor_kwargs={"stages": [stage]}, concurrency=cores, num_cpus=share)
        spans = [s for row in ds.iter_rows() for s in json.loads(row["spans"])]
        return {"spans": spans, "run_wall_s": time.time() - began}
    finally:
        ray.shutdown()

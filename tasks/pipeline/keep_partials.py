"""The dataset stage's partial statistics copied to Redis, for the run's statistics callback (tasks.run.partials)."""

from __future__ import annotations

import logging
from pathlib import Path

from tasks.celery_app import settings
from tasks.outputs.stage_io import output_path
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.redis_client import get_redis
from tasks.run import partials
from tasks.stages import stage_class

log = logging.getLogger("framefleet.pipeline")


class KeepPartials(StageHook):
    """Keep a finished video's partial statistics in Redis; without the copy the callback reads the marker."""

    def after_success(self, call: StageCall) -> None:
        if "stats" not in call.report or stage_class(call.stage_name).writes != "hdf5":
            return
        conf = settings()
        job = call.job
        out_root = Path(job.output_root)
        try:
            output = output_path(out_root, job.video_id, call.stage_name)
            partials.keep(
                get_redis(conf.redis_url), out_root, job.video_id, output, call.report["stats"], conf.result_expires_s
            )
        except Exception as exc:
            log.warning("partial statistics of %s not kept in Redis: %s", job.video_id, exc)

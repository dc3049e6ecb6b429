"""A stage's end counted in its run's progress and in the metrics."""

from __future__ import annotations

import logging
from typing import Any

from tasks.celery_app import settings
from tasks.observe import metrics, progress
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.redis_client import get_redis
from tasks.stages import dataset_stage
from tasks.workers import worker

log = logging.getLogger("framefleet.pipeline")


class Record(StageHook):
    """Count the stage in the run's progress and the metrics; never raises.

    A stage before the last that succeeded leaves the writes to its end (worker.on_task_end), where
    they share the round trip that releases its claim, after Celery has sent the next stage: off the
    chain's path. The dataset stage and a failure write them now, before the task returns: the
    video's end can start the run's callback (tasks.run.completion), which reads the counters and the
    stage log, and a failed video reaches its chain's end at once.
    """

    def after_stage(self, call: StageCall) -> None:
        conf = settings()
        task, stage_name, job = call.task, call.stage_name, call.job
        ok = job.failed is None

        def queue(pipe: Any) -> None:
            progress.add(pipe, job.run_id, stage_name, ok, conf.result_expires_s)
            try:
                metrics.add_stage(pipe, stage_name, job, conf.result_expires_s)
            except Exception as exc:  # a job without the entry's fields: the progress still counts
                log.warning("metrics of %s not recorded: %s", stage_name, exc)

        if ok and stage_name != dataset_stage().name and not task.request.called_directly and task.request.id:
            worker.AT_END[task.request.id] = queue
            return
        try:
            pipe = get_redis(conf.redis_url).pipeline(transaction=False)
            queue(pipe)
            pipe.execute()
        except Exception as exc:  # progress display and metrics are not worth failing a video for
            log.warning("progress and metrics of %s not recorded: %s", stage_name, exc)

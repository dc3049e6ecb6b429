"""A video's end: its chain's last task counts it as finished in its run (tasks.run.completion)."""

from __future__ import annotations

import logging

from tasks.celery_app import settings
from tasks.pipeline.execute import chain_of
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.pipeline.retries import retry_later
from tasks.redis_client import get_redis
from tasks.run import completion

log = logging.getLogger("framefleet.pipeline")


class VideoEnd(StageHook):
    """Count the video, a success or a failure record, when its chain's last stage ends.

    A Redis or broker error retries the task with the job it was given (the stage then finds its
    output made, and counts again).
    """

    def after_task(self, call: StageCall) -> None:
        if call.stage_name != chain_of(call.job)[-1]:
            return
        conf = settings()
        job = call.job
        try:
            completion.video_ended(get_redis(conf.redis_url), job, conf.result_expires_s, sender=call.task.request.id)
        except Exception as exc:
            log.warning("end of %s not counted in run %s (%s); retrying", job.video_id, job.run_id, exc)
            retry_later(call.task, call.given, 10.0, max_retries=call.task.request.retries + 1)

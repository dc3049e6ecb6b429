"""A stage runs only under its run's settings: a worker configured otherwise sends the task on, untouched.

Every field that decides a stage's output (``enabled``, ``backend`` and every parameter: the
backend is loaded with them) must match; none is applied per task, since the models take their
parameters when they load. A stage's ``deadline_s``, ``max_retries`` and ``python`` are the
worker's own and are not compared.
"""

from __future__ import annotations

import logging

import redis
from celery.exceptions import Reject

from tasks.celery_app import settings
from tasks.delivery import routing
from tasks.errors import RedisUnavailable
from tasks.pipeline.hooks import StageCall, StageFailed, StageHook
from tasks.pipeline.retries import wait
from tasks.redis_client import get_redis
from tasks.run import cancel
from tasks.workers import worker

log = logging.getLogger("framefleet.pipeline")


class SameSettings(StageHook):
    """Before anything else: a stage whose run asks for other settings than this worker's is sent at once to
    its settings queue (tasks.delivery.routing.handoff_queue), which only workers with the run's settings
    consume: it runs on one of them, or waits there for one (the stall report names it), never on another
    worker without them."""

    def before_stage(self, call: StageCall) -> None:
        wanted = call.job.settings.get(call.stage_name)
        if not wanted:
            return  # a job of an earlier version: it runs under this worker's settings, as it did
        own = worker.stage_settings(call.stage_name)
        if own["sha256"] == wanted:
            return
        conf = settings()
        try:
            if cancel.is_cancelled(get_redis(conf.redis_url), call.job.run_id):
                return  # the claim stops a cancelled run's task; nothing runs
            queue = routing.handoff_queue(call.stage_name, call.job)
        except redis.RedisError as exc:
            raise StageFailed(
                RedisUnavailable(
                    f"{call.stage_name} of {call.job.video}: this worker runs other settings than the run's and "
                    f"Redis did not answer ({exc}); enqueue again with --continue"
                )
            ) from exc
        log.warning(
            "%s of %s: this worker runs %s (settings %.12s), the run %s asks for settings %.12s; sent on to %s",
            call.stage_name,
            call.job.video_id,
            own["backend"],
            own["sha256"],
            call.job.run_id,
            wanted,
            queue,
        )
        try:
            wait(call, 0, queue)
        except Reject as exc:
            raise StageFailed(
                RedisUnavailable(
                    f"{call.stage_name} of {call.job.video}: this worker runs other settings than the run's and "
                    f"the task could not be sent on ({exc.reason}); enqueue again with --continue"
                )
            ) from exc

"""`framefleet cancel` inside a running stage: checked at every progress report, before the output is written."""

from __future__ import annotations

from tasks.celery_app import settings
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.redis_client import get_redis
from tasks.run import cancel


class Cancellation(StageHook):
    """Stop a stage of a cancelled run at its next progress report: REVOKED, no output, no next stage."""

    def before_stage(self, call: StageCall) -> None:
        # No ping first: the client connects lazily and the checker treats a Redis error as "not cancelled".
        call.held["cancel"] = cancel.Checker(get_redis(settings().redis_url), call.job.run_id)

    def on_progress(self, call: StageCall, done: int, total: int) -> None:
        call.held["cancel"]()

    def after_failure(self, call: StageCall, failure: Exception) -> Exception:
        if isinstance(failure, cancel.RunCancelled):
            cancel.stop(call.task, call.stage_name, call.job)  # raises Ignore
        return failure

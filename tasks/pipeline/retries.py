"""Retries of a stage task: a retryable failure is sent again with backoff, routed afresh at its stage's priority."""

from __future__ import annotations

import dataclasses
import logging

from celery import Task
from celery.exceptions import Reject

from tasks.celery_app import settings
from tasks.delivery.routing import route_task
from tasks.errors import PermanentError, RedisUnavailable, RetryableError, error_class
from tasks.job import Job
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.redis_refusal import refusal

log = logging.getLogger("framefleet.pipeline")


def retry_later(
    task: Task,
    job: Job,
    countdown_s: float,
    max_retries: int | None = None,
    exc: Exception | None = None,
    queue: str | None = None,
) -> None:
    """Send ``task`` again with ``job`` after ``countdown_s`` (to ``queue``, else routed afresh); raises Retry
    (or Reject when it cannot be sent)."""
    # Celery sends a retry back to the queue it came from; route it afresh instead, at the stage's priority.
    # Through the default exchange (routing key = queue): a send to the queue's own exchange needs
    # kombu's binding set, which a Redis restarted without its data no longer has (tasks.delivery.transport).
    payload = job.to_dict()
    route = route_task(task.name, (payload,), {}, {})
    queue = queue or route["queue"]
    raise task.retry(
        args=(payload,),
        exc=exc,
        countdown=countdown_s,
        max_retries=max_retries,
        priority=route.get("priority"),
        queue=queue,
        exchange="",
        routing_key=queue,
    )


def not_sent(reject: Reject) -> str:
    """Why a task's retry could not be sent (``reject``, raised by Celery's retry when the send failed), with the
    fix, and that --continue finishes the video: its failure record says what the user does next."""
    reason = reject.reason
    if why := refusal(reason) if isinstance(reason, BaseException) else None:
        return f"the retry could not be sent: {why}; enqueue again with --continue once Redis takes writes"
    return f"the retry could not be sent: Redis did not answer ({reason}); enqueue again with --continue once it does"


def wait(call: StageCall, countdown_s: float, queue: str | None = None) -> None:
    """Send this task again after ``countdown_s`` (to ``queue``, else routed afresh); waiting does not use up
    its retries for failures."""
    job = dataclasses.replace(call.job, claim_waits=call.job.claim_waits + 1)
    retry_later(call.task, job, countdown_s, max_retries=call.task.request.retries + 1, queue=queue)


class Retries(StageHook):
    """A retryable failure with tries left is retried after ``delay * 2**tries``; else it stands."""

    def after_failure(self, call: StageCall, failure: Exception) -> Exception:
        stage_conf = settings().stages[call.stage_name]
        tries = call.failed_tries
        if isinstance(failure, PermanentError) or tries >= stage_conf.max_retries:
            return failure
        delay = failure.delay_s if isinstance(failure, RetryableError) else 5.0
        log.warning(
            "%s of %s failed (%s: %s); retry %d of %d",
            call.stage_name,
            call.job.video_id,
            error_class(failure),
            failure,
            call.attempts,
            stage_conf.max_retries,
        )
        try:
            retry_later(call.task, call.job, delay * 2**tries, call.job.claim_waits + stage_conf.max_retries, failure)
        except Reject as exc:
            return RedisUnavailable(f"{failure}; {not_sent(exc)}")
        return failure  # not reached: retry_later raises

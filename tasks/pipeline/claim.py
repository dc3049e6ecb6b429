"""The claim on a video's stage around a stage task: one live run at a time, duplicates dropped, starts counted."""

from __future__ import annotations

import logging

import redis
from celery.exceptions import Ignore, Reject

from tasks.celery_app import settings
from tasks.delivery import claims, leases, marks
from tasks.errors import ClaimLost, RedisUnavailable, WorkerLost
from tasks.observe.flower_view import finished_earlier
from tasks.pipeline.hooks import StageCall, StageFailed, StageHook
from tasks.pipeline.retries import not_sent, wait
from tasks.redis_client import get_redis
from tasks.redis_refusal import refusal
from tasks.run import cancel

log = logging.getLogger("framefleet.pipeline")
STARTS = "starts"  # call.held: the task's starts as the claim counted them (None: not counted)


class Claim(StageHook):
    """Claim the stage before it runs (or drop a duplicate, or wait for the run holding it), confirm the
    claim before publishing, and drop this run when another took the stage over meanwhile."""

    def before_stage(self, call: StageCall) -> None:
        try:
            _claim_or_wait(call)
        except Reject as exc:
            raise StageFailed(RedisUnavailable(f"{call.stage_name} of {call.job.video}: {not_sent(exc)}")) from exc

    def fence(self, call: StageCall) -> None:
        conf = settings()
        claims.confirm(get_redis(conf.redis_url), _key(call), conf.lease_ttl_s)

    def after_failure(self, call: StageCall, failure: Exception) -> Exception:
        if isinstance(failure, ClaimLost):
            # Another run took this stage over while ours was cut off; that run publishes and continues the chain.
            log.warning("%s of %s: %s; dropping this run", call.stage_name, call.job.video_id, failure)
            raise Ignore() from failure
        return failure


class Attempts(StageHook):
    """Count every start of a task id (retries and redeliveries alike), so that nothing loops forever.

    The claim counts the start in its own round trip (``STARTS``); only a claim taken over from a dead
    holder leaves the count to this hook's own.
    """

    def before_stage(self, call: StageCall) -> None:
        conf = settings()
        counted = call.held.get(STARTS)
        call.attempts = counted or _count_start(call, claims.marks_ttl_s(conf.visibility_timeout_s))
        stage_conf = conf.stages[call.stage_name]
        if call.attempts > stage_conf.max_retries + 1:
            raise StageFailed(
                WorkerLost(
                    f"{call.stage_name} of {call.job.video} was started {call.attempts - 1} times without "
                    f"finishing: its worker died or passed the {stage_conf.deadline_s:g} s deadline each time"
                )
            )


def _key(call: StageCall) -> str:
    return claims.claim_key(call.job.output_root, call.job.video_id, call.stage_name)


def _count_start(call: StageCall, ttl_s: int) -> int:
    task = call.task
    # The run's hash of start counts of its tasks in flight: a task's field goes when it is marked done
    # (tasks.delivery.claims.finish), the hash when the run ends (tasks.run.completion.retire).
    key = marks.attempts_key(call.job.run_id)
    try:
        pipe = get_redis(settings().redis_url).pipeline()
        pipe.hincrby(key, task.request.id, 1)
        pipe.expire(key, ttl_s)
        return int(pipe.execute()[0])
    except Exception as exc:
        log.warning("start of %s not counted: %s", task.request.id, exc)
        return call.failed_tries + 1


def _claim_or_wait(call: StageCall) -> None:
    """Claim this video's stage, or drop a duplicate delivery, or wait for another run of it.

    Raises Retry (wait, or Redis did not answer), Ignore (a duplicate), or Reject when the
    retry itself could not be sent.
    """
    conf = settings()
    task, stage_name, job = call.task, call.stage_name, call.job
    try:
        verdict = claims.decide(
            get_redis(conf.redis_url),
            _key(call),
            task.request.id,
            task.request.hostname,
            conf.lease_ttl_s,
            cancel_key=cancel.flag_key(job.run_id),  # `framefleet cancel`: checked in the same round trip
            run_id=job.run_id,  # the run's done marks, and its end
            count_ttl_s=claims.marks_ttl_s(conf.visibility_timeout_s),  # the start, for Attempts: same round trip
        )
    except redis.RedisError as exc:
        log.warning(
            "%s of %s: %s; retrying in %g s",
            stage_name,
            job.video_id,
            f"Redis refused the claim: {why}" if (why := refusal(exc)) else f"Redis did not answer the claim ({exc})",
            conf.lease_ttl_s / 2,
        )
        wait(call, conf.lease_ttl_s / 2)
    if verdict.action == "run":
        call.held[STARTS] = verdict.starts
        return
    if verdict.action == "cancelled":
        cancel.stop(task, stage_name, job)
    if verdict.action == "drop":
        log.warning(
            "dropped a second delivery of task %s (%s of %s): %s",
            task.request.id,
            stage_name,
            job.video_id,
            verdict.why,
        )
        leases.dropped_duplicate(task.request.id)
        if not verdict.holder:  # it finished in an earlier delivery, whose end Flower may not have seen
            finished_earlier(task)
        raise Ignore()
    log.info(
        "%s of %s is being made by %s; looking again in %g s",
        stage_name,
        job.video_id,
        verdict.holder,
        conf.lease_ttl_s / 2,
    )
    wait(call, conf.lease_ttl_s / 2)

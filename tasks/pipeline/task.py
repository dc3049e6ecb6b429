"""One Celery task per stage of tasks.stages: a short body, with every concern a hook in HOOKS."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from celery import Task

from tasks.celery_app import TASK_PREFIX, app
from tasks.errors import as_framefleet_error, error_class
from tasks.job import Failure, Job, StageTiming
from tasks.observe.flower_view import VideoTask
from tasks.pipeline import gate, hooks
from tasks.pipeline.cancellation import Cancellation
from tasks.pipeline.claim import Attempts, Claim
from tasks.pipeline.drop_intermediates import DropIntermediates
from tasks.pipeline.execute import execute
from tasks.pipeline.hooks import StageCall, StageFailed, StageHook
from tasks.pipeline.keep_partials import KeepPartials
from tasks.pipeline.oom import Oom
from tasks.pipeline.progress import Progress
from tasks.pipeline.record import Record
from tasks.pipeline.retries import Retries
from tasks.pipeline.same_settings import SameSettings
from tasks.pipeline.video_end import VideoEnd
from tasks.stages import STAGE_NAMES, stage_class
from tasks.workers import worker

log = logging.getLogger("framefleet.pipeline")

# The concerns around every stage, in the order they run at each moment (tasks.pipeline.hooks).
HOOKS: list[StageHook] = [
    SameSettings(),  # a worker not running the run's settings sends the task on, before claiming anything
    Claim(),  # one live run of a video's stage; duplicates dropped; the fence before publishing
    Attempts(),  # every start counted; a task that keeps dying stops
    Cancellation(),  # `framefleet cancel` seen at the next progress report
    Oom(),  # chunk scale in, OOM recorded and the retry shaped
    Retries(),  # a retryable failure sent again with backoff
    KeepPartials(),  # the partial statistics copied for the run's callback
    DropIntermediates(),  # --intermediates drop
    Record(),  # the run's progress counters and the metrics
    Progress(),  # frames done for Flower, and the end of the PROGRESS state
    VideoEnd(),  # the chain's last task counts the video in its run
]


def run_stage(task: Task, stage_name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Run ``stage_name`` for the job message ``payload`` and return the job for the next stage, or a failure record.

    A Redis error anywhere here becomes a retry of this task, or, when not even the retry can
    be sent, a failure record for this one video: never an exception that ends the video's chain.
    A video that failed earlier passes through untouched to its chain's last task, which counts it.
    A message lacking a key it needs raises BadJobMessage; one the gate refuses (tasks.pipeline.gate)
    raises its refusal, having written nothing.
    """
    job = Job.from_dict(payload)
    gate.admit(task, stage_name, job)
    call = StageCall(task, stage_name, given=job, job=job)
    call.attempts = call.failed_tries + 1
    if not job.failed:
        try:
            _run(call)  # a cancelled run stops at the claim, before any work
            hooks.after(HOOKS, "after_stage", call)
        finally:
            hooks.after(HOOKS, "at_exit", call)
        call.job = dataclasses.replace(call.job, claim_waits=0)  # the next stage counts its own
    hooks.after(HOOKS, "after_task", call)
    return call.job.to_dict()


def _run(call: StageCall) -> None:
    try:
        for hook in HOOKS:
            hook.before_stage(call)
        call.started = time.time()
        call.report = execute(call, HOOKS)
    except StageFailed as stop:
        _fail(call, stop.failure)
        return
    except hooks.CONTROL:
        raise  # a hook's Retry, Ignore or Reject ends the task here
    except Exception as exc:
        failure = as_framefleet_error(exc)
        for hook in HOOKS:
            failure = hook.after_failure(call, failure)  # Ignore or Retry end the task here
        _fail(call, failure)
        return
    report, job = call.report, call.job
    timing = StageTiming(
        start=call.started,
        end=time.time(),
        worker=call.task.request.hostname,
        skipped=bool(report.get("skipped")),
        run_s=report.get("run_s", 0.0),
    )
    job = dataclasses.replace(job, timings={**job.timings, call.stage_name: timing})
    if worker.ROLE.gpu is not None:
        job = dataclasses.replace(job, gpu=worker.ROLE.gpu)
    if stage_class(call.stage_name).writes == "hdf5":
        job = dataclasses.replace(job, report={k: v for k, v in report.items() if k not in ("stats", "run_s")})
    if report.get("notes"):
        job = dataclasses.replace(job, notes={**job.notes, call.stage_name: report["notes"]})
    call.job = job
    hooks.after(HOOKS, "after_success", call)


def _fail(call: StageCall, failure: Exception) -> None:
    """Give the video its failure record: it passes through the rest of its chain untouched."""
    log.error("%s of %s failed for good: %s: %s", call.stage_name, call.job.video_id, error_class(failure), failure)
    record = Failure(
        stage=call.stage_name,
        error_class=error_class(failure),
        reason=str(failure),
        attempts=call.attempts,
        worker=call.task.request.hostname,
        time=time.time(),
        detail=getattr(failure, "detail", None),
    )
    call.job = dataclasses.replace(call.job, failed=record)


def _stage_task(stage_name: str) -> Task:
    def body(self: Task, job: dict[str, Any]) -> dict[str, Any]:
        return run_stage(self, stage_name, job)

    body.__name__ = stage_name
    body.__doc__ = f"Run the {stage_name} stage for one video; return the job for the next stage."
    # No stage's result is read: a chain hands each result to the next task in its message, and the
    # chain's last task counts its video in Redis (tasks.run.completion). Not storing them saves two
    # result-backend writes per transition (the result, and the STARTED state: Celery's trace skips
    # track_started for an ignored result, celery/app/trace.py build_tracer) and the 2 KB job kept for
    # result_expires_s. update_state (PROGRESS, REVOKED) still writes, and failures are stored; a caller
    # that wants a result asks for it (apply_async(..., ignore_result=False)).
    return app.task(
        bind=True,
        name=TASK_PREFIX + stage_name,
        acks_late=True,
        base=VideoTask,
        ignore_result=True,
        store_errors_even_if_ignored=True,
        throws=gate.REFUSALS,  # a refused message is logged on one line, without a traceback
        # The job returned, as the worker's log and Flower's result show it: its first 256 characters name the
        # run, video and roots. Celery writes this repr of every success before the task ends (1,024 by
        # default: 0.1-0.2 ms of a transition spent walking the job).
        resultrepr_maxsize=256,
    )(body)


# One task per stage, named framefleet.<stage>.
STAGE_TASKS: dict[str, Task] = {name: _stage_task(name) for name in STAGE_NAMES}

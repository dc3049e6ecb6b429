"""The one gate where a job message enters a worker: its schema (tasks.job_check), this worker's roots
(tasks.workers.confinement) and its run's record and seal on disk (tasks.pipeline.admission), before any hook
claims, reads or writes anything for it.

A refused job writes nothing: no outcome line, no marker, no folder. Its video is counted as failed
in its run when the run is real and sent that video (tasks.run.completion.video_refused: Redis only),
so the run still ends; the task fails with the refusal (field, rule, value) and its chain stops. A job its
run's record and seal disown (admission.NotTheRunsJob) counts nothing: it is no video of that run.
"""

from __future__ import annotations

import logging
import time

from celery import Task

from tasks.celery_app import settings
from tasks.errors import BadJobMessage, PathOutsideRoot, error_class
from tasks.job import Failure, Job
from tasks.job_check import check_id, check_job
from tasks.pipeline import admission
from tasks.redis_client import get_redis
from tasks.run import completion
from tasks.stages import STAGE_NAMES
from tasks.workers import confinement

log = logging.getLogger("framefleet.pipeline")
REFUSALS = (BadJobMessage, PathOutsideRoot)


def admit(task: Task, stage_name: str, job: Job) -> None:
    """Let ``job`` into ``stage_name`` or refuse it (module doc); raises the refusal (BadJobMessage or
    PathOutsideRoot, naming the field)."""
    try:
        check_job(job, stage_name, STAGE_NAMES)
        conf = settings()
        confinement.check(job, conf)
        admission.check(job, conf)
    except REFUSALS as refusal:
        refuse(task, stage_name, job, refusal)
        raise


def refuse(task: Task, stage_name: str, job: Job, refusal: Exception) -> None:
    """Log the refusal on one line, stop the task's chain, and count the video as failed if its run is real."""
    log.error(
        "refused %s of video %r, run %r (task %s): %s", stage_name, job.video_id, job.run_id, task.request.id, refusal
    )
    task.request.chain = None  # the next stage would meet the same job: nothing more runs for it
    task.request.callbacks = None
    if isinstance(refusal, admission.NotTheRunsJob):
        return  # not the run's job: its video's own chain counts it
    try:
        check_id("run_id", job.run_id), check_id("video_id", job.video_id)
    except BadJobMessage:
        return  # ids that name no run's video: there is nothing to count
    failure = Failure(
        stage=stage_name,
        error_class=error_class(refusal),
        reason=str(refusal),
        attempts=1,
        worker=str(task.request.hostname),
        time=time.time(),
    )
    conf = settings()
    try:
        counted = completion.video_refused(get_redis(conf.redis_url), job, failure, conf.result_expires_s)
    except Exception as exc:  # the refusal stands; the run's sweep finds a video that never ended
        log.warning("refusal of %s not counted in run %s: %s", job.video_id, job.run_id, exc)
        return
    if counted:
        log.warning("run %s: %s counted as failed (refused)", job.run_id, job.video_id)

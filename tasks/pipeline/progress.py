"""Frames done, shown while a stage runs: the worker's published state, task-progress events and the
PROGRESS state for Flower, removed at the end where Celery stores no result."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Task, current_task
from celery.app.task import get_actual_ignore_result

from tasks.job import Job
from tasks.observe.flower_view import progress_text
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.workers import worker

log = logging.getLogger("framefleet.pipeline")
PROGRESS_EVENT_INTERVAL_S = 0.5  # at most 2 task-progress events a second per task
PROGRESS_STORED: set[str] = set()  # ids of this process's running tasks whose PROGRESS state was stored


class Progress(StageHook):
    """Report frames done; at most one event every PROGRESS_EVENT_INTERVAL_S."""

    def before_stage(self, call: StageCall) -> None:
        # The first event waits as long as the next ones: a task shorter than the interval sends none
        # (each event is an event publish plus a state write, 2-3 Redis round trips per task).
        call.held["progress_sent"] = time.monotonic()

    def on_progress(self, call: StageCall, done: int, total: int) -> None:
        worker.STATE.update(frames=[done, total])
        if time.monotonic() - call.held["progress_sent"] >= PROGRESS_EVENT_INTERVAL_S:
            call.held["progress_sent"] = time.monotonic()
            job = call.job
            announce(
                {"video_id": job.video_id, "video": job.video, "stage": call.stage_name, "done": done, "total": total}
            )

    def after_stage(self, call: StageCall) -> None:
        end_progress(call.task, call.job)

    def at_exit(self, call: StageCall) -> None:
        PROGRESS_STORED.discard(call.task.request.id)


def announce(meta: dict[str, Any]) -> None:
    """Send ``meta`` as a task-progress event and as the task's PROGRESS state, for Flower; never raises."""
    task = current_task._get_current_object()
    if task is None or task.request.called_directly:
        return
    try:
        task.send_event("task-progress", result=progress_text(meta), **meta)
        task.update_state(state="PROGRESS", meta=meta)
        PROGRESS_STORED.add(task.request.id)
    except Exception as exc:  # progress display is not worth failing a video for
        log.warning("progress of %s not sent: %s", task.request.id, exc)


def end_progress(task: Task, job: Job) -> None:
    """Remove the PROGRESS (or, after a retry, RETRY) state of a task whose result is not stored; never raises.

    Without it a result reader would see that state for result_expires_s (30 days of Redis per
    stage task); with it, the task reads as every task of an ignored result does (PENDING: not
    known), and Flower shows its end from the task-succeeded event. Tasks that sent no progress
    (shorter than PROGRESS_EVENT_INTERVAL_S) and were not retried have no state and write nothing.
    """
    # The per-call ignore_result (apply_async(..., ignore_result=False)) overrides the task's own. A retried
    # task has its RETRY state stored (store_errors_even_if_ignored), kept as long as a result otherwise.
    stored = task.request.id in PROGRESS_STORED or bool(task.request.retries)
    if not stored or not get_actual_ignore_result(task, task.request):
        return  # nothing to remove, or Celery stores this task's end itself
    try:
        task.backend.forget(task.request.id)
    except Exception as exc:
        log.warning("PROGRESS state of %s (%s of %s) not removed: %s", task.request.id, task.name, job.video_id, exc)

"""The moments of a stage task, and the hook class that attaches a concern to the ones it cares about.

A stage task (tasks.pipeline.task) calls every hook of its declared list, in list order, at each
moment below; a hook overrides the few it needs (dramatiq's ``Middleware`` is the model). Hooks
that decide (``before_stage``, ``before_run``, ``on_progress``, ``after_failure``) may raise to stop
the task (Celery's Retry, Ignore or Reject, or StageFailed); the others, which only report, are
called through ``after``, which logs a failing hook instead of failing the video.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from tasks.job import Job

log = logging.getLogger("framefleet.pipeline")


class StageFailed(Exception):
    """Raised by a hook to end the stage now with ``failure`` as the video's failure record, not retried."""

    def __init__(self, failure: Exception) -> None:
        super().__init__(str(failure))
        self.failure = failure


@dataclasses.dataclass
class StageCall:
    """One call of a stage task: what every hook of it sees and may update (``job`` above all)."""

    task: Task
    stage_name: str
    given: Job  # the job message as it arrived: a retry of the video's end resends this one
    job: Job  # the job as it will leave: timings, failure record, chunk scale, report
    attempts: int = 1  # starts of this task, the current one included
    started: float = dataclasses.field(default_factory=time.time)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    held: dict[str, Any] = dataclasses.field(default_factory=dict)  # what a hook keeps between its moments

    @property
    def failed_tries(self) -> int:
        """How many earlier tries of this task failed (Celery's retry count, less the retries that waited)."""
        return int(self.task.request.retries) - self.job.claim_waits


class StageHook:
    """A concern of the stage task; every moment is a no-op until overridden."""

    def before_stage(self, call: StageCall) -> None:
        """Before anything is read: claim, count, refuse."""

    def fence(self, call: StageCall) -> None:
        """Just before the output and its marker are published; what it raises discards them."""

    def before_run(self, call: StageCall, stage: Any) -> None:
        """With the stage's model in hand, before its ``run``."""

    def on_progress(self, call: StageCall, done: int, total: int) -> None:
        """Frames ``done`` of ``total``, reported by the stage while it runs."""

    def after_failure(self, call: StageCall, failure: Exception) -> Exception:
        """The stage raised ``failure``; return it (or what it becomes), or raise Retry/Ignore."""
        return failure

    def after_success(self, call: StageCall) -> None:
        """The stage's output and marker are written and ``call.job`` carries its timing."""

    def after_stage(self, call: StageCall) -> None:
        """The stage ended in a success or in a failure record (not after a retry or a drop)."""

    def at_exit(self, call: StageCall) -> None:
        """Whatever happened, as the stage's part of the task ends."""

    def after_task(self, call: StageCall) -> None:
        """Every task, also one passing a failed video's record on: the job is about to be returned."""


CONTROL = (Retry, Ignore, Reject, StageFailed)


def after(hooks: Iterable[StageHook], moment: str, call: StageCall) -> None:
    """Call ``moment`` of each hook; a hook's error is logged, not raised (Celery's control flow still is)."""
    for hook in hooks:
        try:
            getattr(hook, moment)(call)
        except CONTROL:
            raise
        except Exception:
            log.exception("%s.%s failed for %s of %s", type(hook).__name__, moment, call.stage_name, call.job.video_id)

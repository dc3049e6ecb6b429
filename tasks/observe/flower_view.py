"""What Flower's task list shows of a framefleet task: the video and run as its args, frames done as its result.

Flower's list shows a task's ``argsrepr`` and, for a task in a custom state, the fields of its
last custom event; the job dict itself is too long to read there. The task name stays
``framefleet.<stage>`` (Celery's ``shadow`` would put the video in the name, but the name is a
label of Flower's Prometheus metrics, and one label value per video would swamp them).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from celery import Task

from tasks.delivery import publish

# Flower's default list (name,uuid,state,received,runtime,worker) hides args and result.
TASKS_COLUMNS = "name,uuid,state,args,result,received,started,runtime,worker"
COLUMNS_ENV = "FLOWER_TASKS_COLUMNS"


def describe(args: Sequence[Any] | None) -> str | None:
    """A short line for a stage task's job (``video_003.mp4 · run <id>``) or the callback's run; None otherwise."""
    if not args:
        return None
    first = args[0]
    if isinstance(first, dict) and "video" in first:
        name = PurePosixPath(str(first["video"])).name
        return f"{name} · run {first.get('run_id', '?')}"
    if len(args) == 1 and isinstance(first, dict) and "run_id" in first and "videos" in first:
        return f"run {first['run_id']} · statistics over {first['videos']} videos"
    if len(args) == 2 and isinstance(args[1], dict) and "run_id" in args[1] and isinstance(first, list):
        return f"run {args[1]['run_id']} · statistics over {len(first)} videos"
    return None


def progress_text(meta: dict[str, Any]) -> str:
    """The result column of a task in PROGRESS: frames done of the total, and of which video."""
    return f"{meta.get('done', 0)}/{meta.get('total', '?')} frames of {meta.get('video', meta.get('video_id'))}"


class VideoTask(Task):
    """A task whose messages carry a short args text for Flower, whoever sends them (chain step, retry, callback)."""

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> Any:
        if "argsrepr" not in options and (text := describe(args)) is not None:
            options["argsrepr"] = text
        send = super().apply_async
        return publish.send_once_more_on_closed_channel(
            lambda: send(args, kwargs, task_id, producer, link, link_error, shadow, **options), producer
        )


def default_columns(flower_args: Sequence[str]) -> None:
    """Show args and result in Flower's task list unless its command line or environment chose columns."""
    if not any(a.startswith(("--tasks_columns", "--tasks-columns")) for a in flower_args):
        os.environ.setdefault(COLUMNS_ENV, TASKS_COLUMNS)


def finished_earlier(task: Task) -> None:
    """Tell Flower that a dropped second delivery's task finished in an earlier delivery; never raises.

    Without it a task whose success event was lost (an outage while it finished) would stay in
    PROGRESS in Flower for good: the redelivery is dropped without an event of its own.
    """
    with contextlib.suppress(Exception):  # Flower's view is not worth failing anything for
        task.send_event("task-succeeded", result="finished in an earlier delivery", runtime=0.0)


class RecentEnds:
    """This process's last task ends, so the final events an outage swallowed can be sent again once
    Redis answers (Flower would otherwise show those tasks in PROGRESS for good)."""

    def __init__(self, size: int = 64) -> None:
        self.ends: deque[tuple[float, str, str, str]] = deque(maxlen=size)

    def note(self, task_id: str, state: str, result: object) -> None:
        self.ends.append((time.time(), task_id, state, _short(result)))

    def resend(self, dispatcher: object, since: float) -> int:
        """Send task-succeeded or task-failed again for the ends after ``since`` (epoch s); return how many."""
        sent = 0
        for at, task_id, state, result in list(self.ends):
            if at < since:
                continue
            if state == "SUCCESS":
                dispatcher.send("task-succeeded", uuid=task_id, result=result, runtime=0.0)  # type: ignore[attr-defined]
            elif state == "FAILURE":
                dispatcher.send("task-failed", uuid=task_id, exception=result, traceback="")  # type: ignore[attr-defined]
            else:
                continue
            sent += 1
        return sent


def _short(value: object, limit: int = 200) -> str:
    text = describe([value]) if isinstance(value, dict) else None
    text = text or repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


RECENT_ENDS = RecentEnds()

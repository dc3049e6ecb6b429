"""Timestamps of every step of a stage transition, for bench/trace_transition.py (never imported by framefleet).

Loaded into a worker with ``celery worker --include bench.trace_hooks``; with ``$FF_TRACE_DIR`` set, each
process appends one JSON line per event to ``$FF_TRACE_DIR/<pid>.jsonl``: ``{"t": epoch s, "ev": name,
"id": task id, "ms": duration}``. Wrapped calls record when they began and how long they took; Celery's
signals record when they fired. Nothing is wrapped when ``$FF_TRACE_DIR`` is unset.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import signals

TRACE_ENV = "FF_TRACE_DIR"
_lock = threading.Lock()
_current: dict[str, str | None] = {"id": None}


def emit(ev: str, task_id: str | None, t: float, ms: float = 0.0) -> None:
    """Append one event of this process to its trace file."""
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return
    line = json.dumps({"t": t, "ev": ev, "id": task_id or _current["id"], "ms": ms, "pid": os.getpid()})
    with _lock, open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as fh:
        fh.write(line + "\n")


def timed(ev: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, recording when each call began and how long it took (ms), under the current task id."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, p0 = time.time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            emit(ev, None, t0, (time.perf_counter() - p0) * 1000)

    return wrapper


def _patch(owner: Any, name: str, ev: str) -> None:
    setattr(owner, name, timed(ev, getattr(owner, name)))


def install() -> None:
    """Wrap the calls around a stage transition (framefleet's and Celery's own)."""
    from celery.backends.base import BaseKeyValueStoreBackend
    from celery.events.dispatcher import EventDispatcher
    from celery.worker.request import Request

    from tasks.delivery import claims, leases, routing
    from tasks.observe import metrics, progress
    from tasks.pipeline import claim, oom, record, retries, task
    from tasks.run import cancel

    _patch(routing, "route_task", "route_task")
    _patch(retries, "route_task", "route_task(retry)")
    _patch(record.Record, "after_stage", "_record")
    _patch(oom, "_redis_or_none", "_redis_or_none")
    _patch(claim, "_claim_or_wait", "_claim_or_wait")
    _patch(claim, "_count_start", "_count_start")
    _patch(task, "execute", "_execute")
    _patch(claims, "finish", "claims.finish")
    _patch(claims, "confirm", "claims.confirm")
    if hasattr(cancel, "cancelled_quietly"):  # the base commit's start-of-task check
        _patch(cancel, "cancelled_quietly", "cancel.cancelled_quietly")
    _patch(leases, "on_task_received", "leases.on_task_received")
    _patch(progress, "record", "progress.record")
    _patch(metrics, "record_stage", "metrics.record_stage")
    _patch(BaseKeyValueStoreBackend, "_store_result", "backend.store_result")
    _patch(EventDispatcher, "send", "events.send")
    _patch(Request, "acknowledge", "ack")


if os.environ.get(TRACE_ENV):
    install()

    @signals.before_task_publish.connect(weak=False)
    def _before_publish(headers: Any = None, **_: Any) -> None:
        emit("publish.begin", (headers or {}).get("id"), time.time())

    @signals.after_task_publish.connect(weak=False)
    def _after_publish(headers: Any = None, **_: Any) -> None:
        emit("publish.end", (headers or {}).get("id"), time.time())

    @signals.task_received.connect(weak=False)
    def _received(request: Any = None, **_: Any) -> None:
        emit("received", getattr(request, "id", None), time.time())

    @signals.task_prerun.connect(weak=False)
    def _prerun(task_id: str | None = None, **_: Any) -> None:
        _current["id"] = task_id
        emit("prerun", task_id, time.time())

    @signals.task_postrun.connect(weak=False)
    def _postrun(task_id: str | None = None, **_: Any) -> None:
        emit("postrun", task_id, time.time())

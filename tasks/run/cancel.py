"""Cancel a run: a flag in Redis, its waiting messages taken off the queues, Flower told they are revoked.

A task of a cancelled run that starts (a message already delivered, a retry, the next stage of a
chain) stops before doing anything; a running one stops at its next progress check. Outputs are
written atomically, so every complete output stays valid and ``--continue`` finishes the rest.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import time
from typing import Any

import redis

from tasks import keys
from tasks.delivery.queues import waiting
from tasks.errors import PermanentError
from tasks.job import Job

CANCELLED_EVENT = "task-cancelled"  # Flower shows its task as CANCELLED


class RunCancelled(PermanentError):
    """The run this task belongs to was cancelled (``framefleet cancel``)."""


def flag_key(run_id: str) -> str:
    return keys.CANCELLED_PREFIX + run_id


def is_cancelled(r: redis.Redis, run_id: str) -> bool:
    return bool(r.exists(flag_key(run_id)))


def request(r: redis.Redis, run_id: str, ttl_s: int) -> bool:
    """Mark ``run_id`` cancelled; return False when it already was."""
    return bool(r.set(flag_key(run_id), str(time.time()), ex=ttl_s, nx=True))


def decode(raw: str | bytes) -> tuple[str, str, list[Any]]:
    """(task name, task id, args) of a kombu message as it sits in a Redis queue."""
    message = json.loads(raw)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, _kwargs, _embed = json.loads(body)
    headers = message.get("headers", {})
    return headers.get("task", ""), headers.get("id", ""), list(args or [])


def run_of(args: list[Any]) -> str | None:
    """The run id a stage task's job (or the chord callback's run record) carries, or None."""
    first = args[0] if args else None
    if isinstance(first, dict) and "run_id" in first:
        return first["run_id"]
    if len(args) == 2 and isinstance(args[1], dict):  # the chord callback: (results, run)
        return args[1].get("run_id")
    return None


def message_ids(raw: str | bytes) -> tuple[str, str, str | None]:
    """(task name, task id, run id or None) of a kombu message as it sits in a Redis queue."""
    name, task_id, args = decode(raw)
    return name, task_id, run_of(args)


def remove_waiting(broker: redis.Redis, queues: list[str], run_id: str) -> list[tuple[str, str]]:
    """Take the run's messages off ``queues``; return (task name, task id) of each one removed.

    A message a worker takes between the read and the removal is not removed here: that task sees
    the flag when it starts.
    """
    removed = []
    for queue in queues:
        for key, raw in waiting(broker, queue):
            try:
                name, task_id, run = message_ids(raw)
            except (ValueError, KeyError, TypeError, IndexError):
                continue  # not a Celery message of ours
            if run == run_id and broker.lrem(key, 1, raw):
                removed.append((name, task_id))
    return removed


def revoker(queue: str, workers: list[dict[str, Any]], seen: list[str]) -> str | None:
    """The node name Flower is told revoked a message removed from ``queue``: a live worker consuming that queue,
    else any live worker, else one Redis saw before (``seen``); None when there is none."""
    names = sorted(w["hostname"] for w in workers if queue in (w.get("queues") or []))
    names += sorted(w["hostname"] for w in workers)
    return (names or sorted(seen) or [None])[0]


def tell_flower(app: Any, removed: list[tuple[str, str]], hostname: str | None = None) -> None:
    """Send task-revoked for each removed message, so Flower does not show them waiting forever.

    Each event names a node, and Flower lists every node an event names on its Workers page for good: the
    events name ``hostname`` (a worker that was to take the message, ``revoker``). With none, they come from
    the cancel's own node name, taken off the page again by a worker-offline event where Flower honours it.
    """
    if not removed:
        return
    with app.connection_for_write() as conn:
        own = hostname is None
        name = hostname or f"framefleet-cancel@{socket.gethostname()}"
        dispatcher = app.events.Dispatcher(conn, hostname=name, enabled=True)
        try:
            for _name, task_id in removed:
                dispatcher.send("task-revoked", uuid=task_id, terminated=False, signum=None, expired=False)
            if own:
                dispatcher.send("worker-offline")
        finally:
            dispatcher.close()


class Checker:
    """Raises RunCancelled once the run is cancelled; reads Redis at most every ``every_s`` seconds."""

    def __init__(self, r: redis.Redis | None, run_id: str, every_s: float = 1.0) -> None:
        self.r, self.run_id, self.every_s = r, run_id, every_s
        self.last = time.monotonic()

    def __call__(self) -> None:
        if self.r is None or time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        try:
            cancelled = is_cancelled(self.r, self.run_id)
        except redis.RedisError:
            return  # an unreachable Redis is not a cancel; the stage goes on
        if cancelled:
            raise RunCancelled(f"run {self.run_id} was cancelled")


def stop(task: Any, stage: str, job: Job) -> None:
    """End a task of a cancelled run: REVOKED in the results and in Flower, no next stage; raises Ignore."""
    from celery import states
    from celery.exceptions import Ignore

    with contextlib.suppress(Exception):  # the stop matters, not its display
        task.update_state(
            state=states.REVOKED, meta={"cancelled": job.run_id, "stage": stage, "video_id": job.video_id}
        )
        task.send_event("task-revoked", terminated=False, signum=None, expired=False)
        # A task that sent task-progress stays PROGRESS in Flower whatever revoked says: Celery's event state
        # ranks a custom state above REVOKED. A custom state of equal rank replaces it.
        task.send_event(CANCELLED_EVENT, result=f"cancelled with run {job.run_id}", stage=stage)
    raise Ignore()

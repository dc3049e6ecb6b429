"""A worker's background thread: heartbeat events, registry state, and the queue rebalancer.

A busy solo worker is deaf and silent, so this thread keeps it visible while a task runs.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import celery

from tasks.celery_app import settings
from tasks.delivery import claims, leases, routing
from tasks.delivery.rebalance import rebalance
from tasks.observe import flower_view
from tasks.redis_client import get_redis
from tasks.redis_refusal import refusal
from tasks.run import sweep
from tasks.workers import registry

log = logging.getLogger("framefleet.heartbeat")


REFUSAL_REPEAT_S = 60.0  # a refused part of the tick is logged once in this long (a tick is ~1 s)


class Heartbeat(threading.Thread):
    """Every ``heartbeat_interval_s``: send worker-heartbeat, re-assert leases, publish state, read the registry
    for routing, reap, rebalance."""

    running: ClassVar[dict[str, Heartbeat]] = {}

    def __init__(self, app: celery.Celery, state: Callable[[], dict[str, Any]]) -> None:
        super().__init__(name="framefleet-heartbeat", daemon=True)
        self.app = app
        self.state = state
        self.stopping = threading.Event()
        self.dispatcher: Any = None
        self.errors = 0
        # When this worker's Redis calls last came back after failing (monotonic s); None while failing.
        self.redis_back_at: float | None = -float("inf")
        # Since when heartbeat events fail (epoch s): task ends sent meanwhile may be lost to Flower.
        self.events_lost_since: float | None = None
        # When each part's refusal (a full or read-only Redis) was last logged (monotonic s): once a minute is enough.
        self.refusal_said: dict[str, float] = {}

    @classmethod
    def start_for(cls, app: celery.Celery, state: Callable[[], dict[str, Any]]) -> Heartbeat:
        beat = cls(app, state)
        cls.running[state()["hostname"]] = beat
        beat.start()
        return beat

    @classmethod
    def stop_running(cls, hostname: str) -> None:
        beat = cls.running.pop(hostname, None)
        if beat is not None:
            beat.stopping.set()
            beat.join(timeout=5)
        try:
            registry.remove(get_redis(settings().redis_url), hostname)
        except Exception as exc:  # leaving is best effort; the key's TTL ends it anyway
            log.warning("could not deregister %s: %s", hostname, exc)

    def run(self) -> None:
        conf = settings()
        while not self.stopping.is_set():
            try:
                self.tick(conf)
            except Exception:  # one bad tick must not end the thread: the leases would lapse
                self.failed("the heartbeat tick")
            self.stopping.wait(conf.heartbeat_interval_s)
        if self.dispatcher is not None:
            self.dispatcher.close()

    def failed(self, what: str) -> None:
        """Log and count a failed part of a tick (published as heartbeat_errors, a metric); called in its except."""
        self.errors += 1
        exc = sys.exc_info()[1]
        if exc is not None and (why := refusal(exc)):  # full or read-only: the cause and fix, not a traceback a tick
            now = time.monotonic()
            if now - self.refusal_said.get(what, -REFUSAL_REPEAT_S) >= REFUSAL_REPEAT_S:
                self.refusal_said[what] = now
                log.warning(
                    "%s failed (%d so far; said again in %g s if it lasts): %s",
                    what,
                    self.errors,
                    REFUSAL_REPEAT_S,
                    why,
                )
            return
        log.warning("%s failed (%d so far)", what, self.errors, exc_info=True)

    def tick(self, conf: Any) -> None:
        """One round: event, leases and claims re-asserted, state published, reaper, rebalancer, sweep, deadline.

        Each part runs whatever the others did; a part that fails is logged and counted.
        """
        state = {**self.state(), "heartbeat_errors": self.errors}
        self.enforce_deadline(state, conf)
        try:
            self.send_event(state, conf.heartbeat_interval_s)
            if self.events_lost_since is not None:  # back: tell Flower again how the tasks meanwhile ended
                flower_view.RECENT_ENDS.resend(self.dispatcher, self.events_lost_since - conf.heartbeat_interval_s)
                self.events_lost_since = None
        except Exception:
            self.failed("the worker-heartbeat event")
            self.dispatcher = None
            self.events_lost_since = self.events_lost_since or time.time()
        redis_ok = True
        for what, part in (
            ("renewing leases", lambda: leases.renew(get_redis(conf.broker), state["hostname"], conf.lease_ttl_s)),
            ("renewing claims", lambda: claims.renew(get_redis(conf.redis_url), conf.lease_ttl_s)),
            (
                "publishing the worker state",
                lambda: registry.publish(get_redis(conf.redis_url), state, ttl_s=conf.registry_ttl_s),
            ),
        ):
            try:
                part()
            except Exception:
                redis_ok = False
                self.failed(what)
        now = time.monotonic()
        if not redis_ok:
            self.redis_back_at = None
            return
        if self.redis_back_at is None:
            self.redis_back_at = now  # back: give every holder a lease TTL to re-assert before reaping
        try:  # one heartbeat old at most, like the registry itself: the state it holds is that old
            routing.refresh_registry(get_redis(conf.redis_url), conf.redis_url, conf.heartbeat_interval_s + 0.5)
        except Exception:
            self.failed("reading the registry for routing")
        try:
            if now - self.redis_back_at >= conf.lease_ttl_s:
                leases.reap(self.app, get_redis(conf.broker), get_redis(conf.redis_url), conf.lease_ttl_s)
            rebalance(get_redis(conf.redis_url), conf, broker=get_redis(conf.broker))
        except Exception:
            self.failed("the reaper or the rebalancer")
        try:  # a video of a run in flight whose message is nowhere is sent again (once per SWEEP_EVERY_S)
            if now - self.redis_back_at >= conf.lease_ttl_s:
                sweep.sweep(get_redis(conf.redis_url), get_redis(conf.broker), conf)
        except Exception:
            self.failed("the sweep of runs in flight")

    def send_event(self, state: dict[str, Any], interval: float) -> None:
        if self.dispatcher is None:
            self.dispatcher = self.app.events.Dispatcher(
                self.app.connection_for_write(), hostname=state["hostname"], enabled=True
            )
        self.dispatcher.send(
            "worker-heartbeat",
            freq=interval,
            sw_ident="py-celery",
            sw_ver=celery.__version__,
            sw_sys=platform.system(),
            active=1 if state.get("busy") else 0,
            processed=state.get("tasks_done", 0),
            loadavg=[round(x, 2) for x in os.getloadavg()],
        )

    def enforce_deadline(self, state: dict[str, Any], conf: Any) -> None:
        """End the process when its task runs past the stage's deadline (solo has no time limit)."""
        current = state.get("current") or {}
        task, started = current.get("task"), current.get("started")
        if not task or not started or current.get("committed"):
            return  # no task, or its output is written (tasks.workers.worker.note_committed)
        stage = task.rsplit(".", 1)[-1]
        deadline = conf.stages[stage].deadline_s if stage in conf.stages else None
        if deadline and time.time() - started > deadline:
            log.critical(
                "%s of %s ran %.1f s, past its %g s deadline: ending this worker; its lease "
                "lapses and the task is retried elsewhere",
                stage,
                current.get("video"),
                time.time() - started,
                deadline,
            )
            logging.shutdown()
            os._exit(70)

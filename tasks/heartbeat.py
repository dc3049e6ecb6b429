"""A worker's background thread: heartbeat events, registry state, and the queue rebalancer.

A busy solo worker is deaf and silent, so this thread keeps it visible while a task runs.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import celery

from tasks import claims, flower_view, leases, registry
from tasks.celery_app import settings
from tasks.rebalance import rebalance
from tasks.redis_client import get_redis

log = logging.getLogger("framefleet.heartbeat")


class Heartbeat(threading.Thread):
    """Every ``heartbeat_interval_s``: send worker-heartbeat, publish state, rebalance queues."""

    running: ClassVar[dict[str, Heartbeat]] = {}

    def __init__(self, app: celery.Celery, state: Callable[[], dict[str, Any]]) -> None:
        super().__init__(name="framefleet-heartbeat", daemon=True)
        self.app = app
        self.state = state
        self.stopping = threading.Event()

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
        interval = conf.heartbeat_interval_s
        dispatcher = None
        offline_since: float | None = None
        while not self.stopping.is_set():
            state = self.state()
            try:
                if dispatcher is None:
                    dispatcher = self.app.events.Dispatcher(
                        self.app.connection_for_write(), hostname=state["hostname"], enabled=True
                    )
                dispatcher.send(
                    "worker-heartbeat", freq=interval, sw_ident="py-celery",
                    sw_ver=celery.__version__, sw_sys=platform.system(),
                    active=1 if state.get("busy") else 0, processed=state.get("tasks_done", 0),
                    loadavg=[round(x, 2) for x in os.getloadavg()],
                )
                if offline_since is not None:  # back: the task ends sent meanwhile may be lost
                    flower_view.RECENT_ENDS.resend(dispatcher, offline_since - interval)
                    offline_since = None
            except Exception as exc:
                log.warning("heartbeat event not sent: %s", exc)
                dispatcher = None
                offline_since = offline_since or time.time()
            try:
                broker = get_redis(conf.broker)
                leases.renew(broker, conf.lease_ttl_s)
                leases.reap(self.app, broker, conf.lease_ttl_s)
                r = get_redis(conf.redis_url)
                claims.renew(r, conf.lease_ttl_s)
                registry.publish(r, state, ttl_s=conf.registry_ttl_s)
                rebalance(r, conf)
            except Exception as exc:
                log.warning("registry update failed: %s", exc)
            self.enforce_deadline(state, conf)
            self.stopping.wait(interval)
        if dispatcher is not None:
            dispatcher.close()

    def enforce_deadline(self, state: dict[str, Any], conf: Any) -> None:
        """End the process when its task runs past the stage's deadline (solo has no time limit)."""
        current = state.get("current") or {}
        task, started = current.get("task"), current.get("started")
        if not task or not started:
            return
        stage = task.rsplit(".", 1)[-1]
        deadline = conf.stages[stage].deadline_s if stage in conf.stages else None
        if deadline and time.time() - started > deadline:
            log.critical("%s of %s ran %.0f s, past its %.0f s deadline: ending this worker; its lease "
                         "lapses and the task is retried elsewhere", stage, current.get("video"),
                         time.time() - started, deadline)
            logging.shutdown()
            os._exit(70)

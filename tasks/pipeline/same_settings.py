"""A stage runs only under its run's settings: a worker configured otherwise sends the task on, untouched.

Every field that decides a stage's output (``enabled``, ``backend`` and every parameter: the
backend is loaded with them) must match; none is applied per task, since the models take their
parameters when they load. A stage's ``deadline_s``, ``max_retries`` and ``python`` are the
worker's own and are not compared.
"""

from __future__ import annotations

import json
import logging
import time

import redis
from celery.exceptions import Reject

from tasks import keys
from tasks.celery_app import settings
from tasks.delivery import routing
from tasks.errors import RedisUnavailable
from tasks.pipeline.hooks import StageCall, StageFailed, StageHook
from tasks.pipeline.retries import wait
from tasks.redis_client import get_redis
from tasks.run import cancel, runs
from tasks.workers import worker
from worker_config.settings_match import serves

log = logging.getLogger("framefleet.pipeline")


def wait_key(run_id: str, stage: str) -> str:
    return f"{keys.SETTINGS_WAIT_PREFIX}{run_id}:{stage}"


class SameSettings(StageHook):
    """Before anything else: a stage whose run asks for other settings than this worker's is retried later,
    routed to a live worker that advertises the run's (tasks.delivery.routing), and noted for the stall report."""

    def before_stage(self, call: StageCall) -> None:
        wanted = call.job.settings.get(call.stage_name)
        if not wanted:
            return  # a job of an earlier version: it runs under this worker's settings, as it did
        own = worker.stage_settings(call.stage_name)
        if own["sha256"] == wanted:
            return
        conf = settings()
        countdown = conf.lease_ttl_s / 2  # no live worker has the run's settings: look again this often
        try:
            r = get_redis(conf.redis_url)
            if cancel.is_cancelled(r, call.job.run_id):
                return  # the claim stops a cancelled run's task; nothing runs
            if any(serves(w, call.stage_name, wanted) for w in routing.live_workers(r, conf.redis_url)):
                countdown = conf.heartbeat_interval_s  # one does: the retry is routed to it
            _note_wait(r, call, wanted, countdown)
        except redis.RedisError as exc:
            log.warning("the settings wait of %s was not recorded: %s", call.job.video_id, exc)
        log.warning(
            "%s of %s: this worker runs %s (settings %.12s), the run %s asks for settings %.12s; "
            "sent on in %g s to a worker with the run's settings",
            call.stage_name,
            call.job.video_id,
            own["backend"],
            own["sha256"],
            call.job.run_id,
            wanted,
            countdown,
        )
        try:
            wait(call, countdown)
        except Reject as exc:
            raise StageFailed(
                RedisUnavailable(
                    f"{call.stage_name} of {call.job.video}: this worker runs other settings than the run's and "
                    f"the task could not be sent on ({exc.reason}); enqueue again with --continue"
                )
            ) from exc


def _note_wait(r: redis.Redis, call: StageCall, wanted: str, countdown_s: float) -> None:
    """Record that the run's stage waits for a worker with its settings: what the stall report says."""
    record = runs.lookup(r, call.job.run_id) or {}
    note = {
        "run_id": call.job.run_id,
        "stage": call.stage_name,
        "sha256": wanted,
        "run": (record.get("stage_settings") or {}).get("stages", {}).get(call.stage_name),
        "config": record.get("config"),
        "settings_env": record.get("settings_env") or {},
        "seen_by": call.task.request.hostname,
        "time": time.time(),
    }
    r.set(wait_key(call.job.run_id, call.stage_name), json.dumps(note), ex=max(60, int(4 * countdown_s)))

"""Account for every video of a run in flight, and send again one whose message is gone.

A video is in flight from its chain's send (its job in ``ff:run:<id>:sent``) until its end is
counted (``ff:run:<id>:finished``, tasks.run.completion). Meanwhile its current stage's message waits
in a queue, sits in kombu's ``unacked`` (taken by a worker, or a countdown retry a worker holds),
or its task runs on a live worker. A video found in none of these on two sweeps at least
CONFIRM_S apart lost its message (a send that failed for good during a long outage, a Redis that
came back from an older save, a message deleted by hand): it is sent again from its first
unfinished stage, and the resend is recorded for the run's summary (``resent``).

Sending twice never runs a stage twice at once: a finished stage is skipped (its done marker),
and a stage running elsewhere holds its claim, so the second delivery waits or is dropped
(tasks.delivery.claims). One sweep runs at a time across hosts (a lock that also spaces them SWEEP_EVERY_S
apart); the first miss of a video is kept in Redis, so sweepers on several hosts agree.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import redis

from tasks import keys
from tasks.delivery import leases, queues
from tasks.job import Job
from tasks.observe import stall
from tasks.run import cancel, completion, runs
from tasks.workers import registry
from worker_config.settings import Settings

log = logging.getLogger("framefleet.sweep")
SWEEP_EVERY_S = 10.0  # at most one sweep this often, over every host
CONFIRM_S = 5.0  # a video missed twice this far apart (at least) is resent
LOCK = keys.SWEEP_LOCK
# KEYS: the set of runs sending, the run's sent hash; ARGV: the run id. It leaves the set only while its hash is gone.
_LET_GO = """
if redis.call('EXISTS', KEYS[2]) == 0 then return redis.call('SREM', KEYS[1], ARGV[1]) end
return 0
"""


def located(broker: redis.Redis, r: redis.Redis, conf: Settings) -> set[tuple[str, str]]:
    """(run id, video id) of every stage message waiting in a queue or in ``unacked``, read in one
    MULTI (a message moving from a queue into ``unacked`` meanwhile is seen once), and of every task
    a live worker runs."""
    lists = [key for queue in stall.queue_names(broker, r, conf) for key in queues.physical_keys(queue)]
    pipe = broker.pipeline(transaction=True)
    for key in lists:
        pipe.lrange(key, 0, -1)
    pipe.hvals(leases.UNACKED)
    *waiting, held = pipe.execute()
    raws = [raw for found in waiting for raw in found]
    raws += [json.dumps(json.loads(entry)[0]) for entry in held]
    found = set()
    for raw in raws:
        try:
            _, _, args = cancel.decode(raw)
        except (ValueError, KeyError, TypeError, IndexError):
            continue
        job = Job.peek(args[0]) if args else None
        if job is not None:
            found.add((job.run_id, job.video_id))
    for worker in registry.live_workers(r):
        current = worker.get("current") or {}
        if current.get("run") and current.get("video"):
            found.add((current["run"], current["video"]))
    return found


def in_flight(r: redis.Redis, run_id: str) -> dict[str, Job]:
    """The videos of ``run_id`` sent and not yet counted as finished, by video id.

    The sent hash holds the videos in flight (a window); each is looked up in the run's order (a
    finished video has its place there) by itself (HEXISTS), never with a read of every finished video.
    A video counted between the two reads is in both, and left out: it has finished.
    """
    from tasks.statistics import sums

    sent = {
        (v.decode() if isinstance(v, bytes) else v): raw for v, raw in r.hgetall(completion.sent_key(run_id)).items()
    }
    shards = sums.run_shards(r, run_id) if sent else 1
    pipe = r.pipeline(transaction=False)
    for vid in sent:
        pipe.hexists(*completion.order_of(run_id, vid, shards))
    done = pipe.execute() if sent else []
    return {
        vid: Job.from_dict(json.loads(raw))
        for (vid, raw), counted in zip(sent.items(), done, strict=True)
        if not counted
    }


def active_runs(r: redis.Redis) -> list[str]:
    """Runs with videos sent whose statistics callback was not sent yet, and not cancelled.

    Read from the set of runs that sent videos (``ff:runs-sending``, one read), never a scan of every key;
    a run whose sent hash is gone (its videos all counted, or expired) leaves the set, atomically with
    the check, so a send in between keeps it there.
    """
    listed = sorted(m if isinstance(m, str) else m.decode() for m in r.smembers(keys.RUNS_SENDING))
    pipe = r.pipeline(transaction=False)
    for run_id in listed:
        pipe.exists(completion.sent_key(run_id))
    found = []
    for run_id, sent in zip(listed, pipe.execute(), strict=True):
        if not sent:
            r.eval(_LET_GO, 2, keys.RUNS_SENDING, completion.sent_key(run_id), run_id)
            continue
        run_hash = runs.redis_key(run_id)  # its callback sent (or its files written): not in flight
        callback = r.hexists(run_hash, keys.RUN_AGGREGATED_FIELD) or r.hexists(run_hash, keys.RUN_ENDED_FIELD)
        if not callback and not cancel.is_cancelled(r, run_id):
            found.append(run_id)
    return sorted(found)


def first_unfinished(job: Job) -> str:
    """The first stage of ``job``'s chain without a valid output (its last stage when all are done)."""
    from tasks.outputs.stage_io import read_done

    if job.force:  # outputs of earlier runs are to be made again: all of them
        return job.chain[0]
    for stage in job.chain:
        if read_done(Path(job.output_root), job.video_id, stage) is None:
            return stage
    return job.chain[-1]  # every output made: its end is still to be counted


def resend(r: redis.Redis, job: Job, ttl_s: int) -> dict[str, Any]:
    """Send ``job``'s chain again from its first unfinished stage; record and return the resend."""
    from celery import chain

    from tasks.celery_app import TASK_PREFIX, app

    stage = first_unfinished(job)
    # By name from Celery's registry, as tasks.run.dataset does: the run sits below the stage task.
    first, *rest = (app.tasks[TASK_PREFIX + name] for name in job.chain[job.chain.index(stage) :])
    chain(first.s(job.to_dict()), *(t.s() for t in rest)).apply_async()
    entry = {"video_id": job.video_id, "video": job.video, "stage": stage, "time": time.time()}
    pipe = r.pipeline()
    pipe.rpush(keys.RESENT_PREFIX + job.run_id, json.dumps(entry))
    pipe.expire(keys.RESENT_PREFIX + job.run_id, ttl_s)
    pipe.execute()
    log.warning(
        "%s of run %s had no message anywhere on two sweeps: sent again from %s", job.video_id, job.run_id, stage
    )
    return entry


def resent(r: redis.Redis, run_id: str) -> list[dict[str, Any]]:
    """The run's resends, oldest first."""
    return [json.loads(raw) for raw in r.lrange(keys.RESENT_PREFIX + run_id, 0, -1)]


def sweep(r: redis.Redis, broker: redis.Redis, conf: Settings, force: bool = False) -> list[dict[str, Any]]:
    """One sweep of every active run (unless another ran less than SWEEP_EVERY_S ago); return the resends.

    Nothing is swept while either Redis is younger than a lease TTL: live workers re-register first.
    ``force`` sweeps now, however recently another sweep ran (for tests and tools).
    """
    if not force and not r.set(LOCK, "1", nx=True, px=int(SWEEP_EVERY_S * 1000)):
        return []
    if leases.redis_uptime_s(r) < conf.lease_ttl_s or leases.redis_uptime_s(broker) < conf.lease_ttl_s:
        return []
    runs = active_runs(r)
    if not runs:
        return []
    found = located(broker, r, conf)
    now = registry.redis_now(r)
    out = []
    for run_id in runs:
        missing_key = keys.SWEEP_PREFIX + run_id
        flying = in_flight(r, run_id)
        misses = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in r.hgetall(missing_key).items()}
        gone = {vid for vid in flying if (run_id, vid) not in found}
        if stale := [vid for vid in misses if vid not in gone]:
            r.hdel(missing_key, *stale)
        for vid in sorted(gone):
            first_miss = misses.get(vid)
            if first_miss is None:
                r.hset(missing_key, vid, str(now))
                r.expire(missing_key, conf.result_expires_s)
            elif now - first_miss >= CONFIRM_S:
                out.append(resend(r, flying[vid], conf.result_expires_s))
                r.hdel(missing_key, vid)
    return out

"""A run's end without a Celery chord: finished videos are counted in Redis, and the count starts the statistics.

Why not a chord (DESIGN.md, "a run"): a chord of N chains must be sent whole before anything runs
(50,000 videos: about 15 minutes of sending on a loaded host and 180 MiB of waiting messages in
Redis), and its callback message carries every chain's last result (35 MiB at 50,000 videos).
Instead:

- the enqueuer sends the first ``window`` chains as it walks the folder and keeps the other videos' jobs in
  Redis (tasks.run.pending: the shared fields once, about 20 B per video), so the run never depends on the
  enqueuer once it has walked the folder; its size is recorded then (``listed``), and until then no
  count ends the run;
- the task that ends a video's chain (its last stage, with the video's result or its failure record)
  appends the video's line to the run's outcomes files in OUT (tasks.records.outcome_files), then counts it
  once, by its place in the run's order, adding what it adds to the summary to the run's counters
  ``ff:run:<id>:tally`` (integers: tasks.run.tally.counts) or its failure record to ``ff:run:<id>:failed``,
  in one Lua call, so a redelivered task counts its video once; the k-th video to finish sends pending
  job k-1, keeping ``window`` videos in flight. Nothing of a done video's outcome stays in Redis;
- the task whose record brings the count to the run's size sets the field ``aggregated`` of the
  run's hash ``ff:run:<id>`` NX and sends ``aggregate`` with the run's callback id: once, however
  often the last task is delivered (and again by that same task's redelivery if its worker died
  between the flag and the send). The callback reads the counters, not the outcomes, nor a message;
- once the callback has written the run's files it retires the run (``retire``): the field ``ended``
  marks it, the per-video keys (order, done marks, attempts) go, the counters and stage log soon after,
  and a task of the run delivered later is dropped as a duplicate (tasks.delivery.claims) and counts
  nothing here.

A pending job is sent before its field is deleted: a worker killed in between sends it again on
redelivery (its stage done-mark is set only after it returns, tasks.delivery.claims.finish), and the second
chain skips the outputs the first one made and counts the same video id once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from tasks import keys
from tasks.celery_app import TASK_PREFIX, app
from tasks.errors import PathOutsideRoot
from tasks.job import Failure, Job
from tasks.job_check import check_id
from tasks.records import manifest
from tasks.run import pending, runs
from tasks.run.dataset import video_chain

log = logging.getLogger("framefleet.completion")
WINDOW_PER_WORKER = 4  # videos in flight per live worker: each worker's next task is already waiting
MIN_WINDOW = 32  # the automatic window with few (or not yet any) workers
OUTCOME_KEYS = ("video_id", "video", "failed", "timings", "notes", "gpu", "report")

# KEYS: the video's shard of the order, sent, the run's hash, the run's counters, its failures, an earlier
# version's outcomes; ARGV: video id, the video's mark (tasks.statistics.sums.mark_of), ttl, "done" or "failed", the
# failure record, how many counters to add, then (counter, integer) to add, then (counter, integer) to raise to.
# A video is counted once, by its place in the order (its mark): a redelivered or repeated end adds nothing,
# but a done end of a video counted as failed replaces its failure (a second chain of a video that failed may
# succeed), and a failed end of a video counted as failed replaces the record; a failure never replaces a done
# video (its file is complete). The sent hash holds the videos in flight only (tasks.run.sweep reads it whole).
# The count includes an earlier version's outcomes (its order held the same marks). Returns {k, count}, or
# {0, 0} when the run has ended (a late duplicate: nothing is recorded).
_RECORD = """
if redis.call('HEXISTS', KEYS[3], 'ended') == 1 then return {0, 0} end
redis.call('HDEL', KEYS[2], ARGV[1])
local k = redis.call('HGET', KEYS[1], ARGV[2])
local count
local apply = false
if not k then
  count = redis.call('HINCRBY', KEYS[4], 'videos', 1) + redis.call('HLEN', KEYS[6])
  k = count
  redis.call('HSET', KEYS[1], ARGV[2], k)
  apply = true
else
  count = tonumber(redis.call('HGET', KEYS[4], 'videos') or '0') + redis.call('HLEN', KEYS[6])
  if redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1 then
    if ARGV[4] == 'done' then
      redis.call('HDEL', KEYS[5], ARGV[1])
      apply = true
    else
      redis.call('HSET', KEYS[5], ARGV[1], ARGV[5])
    end
  end
end
if apply then
  if ARGV[4] == 'done' then
    local n = tonumber(ARGV[6])
    for i = 7, 6 + 2 * n, 2 do redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1]) end
    for i = 7 + 2 * n, #ARGV, 2 do
      local held = redis.call('HGET', KEYS[4], ARGV[i])
      if not held or tonumber(held) < tonumber(ARGV[i + 1]) then redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1]) end
    end
  else
    redis.call('HSET', KEYS[5], ARGV[1], ARGV[5])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[4], ARGV[3])
if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('EXPIRE', KEYS[5], ARGV[3]) end
return {tonumber(k), count}
"""


def key(run_id: str, suffix: str) -> str:
    return keys.RUN_PREFIX + run_id + suffix


def sent_key(run_id: str) -> str:
    return key(run_id, keys.RUN_SENT_SUFFIX)


def order_of(run_id: str, video_id: str, shards: int) -> tuple[str, bytes]:
    """(the shard of the run's order that holds ``video_id``'s place, its mark there): the 8-byte digest of the
    merged marks (tasks.statistics.sums), in hashes of the same shards, each small enough for Redis's listpack
    encoding (about 20 B per video; one hash of video ids took about 90)."""
    from tasks.statistics import sums

    mark = sums.mark_of(video_id)
    return f"{key(run_id, keys.RUN_ORDER_SUFFIX)}:{int.from_bytes(mark[:4], 'little') % shards:x}", mark


def order_keys(run_id: str, shards: int) -> list[str]:
    """Every order key a run of ``shards`` shards may have written (to delete them: no scan)."""
    return [f"{key(run_id, keys.RUN_ORDER_SUFFIX)}:{i:x}" for i in range(shards)]


def note_sent(r: redis.Redis, jobs: list[Job], ttl_s: int) -> None:
    """Record that the chains of ``jobs`` are being sent, for tasks.run.sweep (before the send: a crash
    between the two leaves a video the sweep finds nowhere, and sends)."""
    by_run: dict[str, dict[str | bytes, str]] = {}
    for job in jobs:
        by_run.setdefault(job.run_id, {})[job.video_id] = json.dumps(job.to_dict())
    if not by_run:
        return
    pipe = r.pipeline(transaction=False)
    for run_id, mapping in by_run.items():
        pipe.hset(sent_key(run_id), mapping=mapping)
        pipe.expire(sent_key(run_id), ttl_s)
    pipe.sadd(keys.RUNS_SENDING, *by_run)  # after the sent hash: the sweep lets a run go only when its hash is gone
    pipe.execute()


def auto_window(live_workers: int) -> int:
    """The default number of videos in flight: WINDOW_PER_WORKER per live worker, at least MIN_WINDOW."""
    return max(MIN_WINDOW, WINDOW_PER_WORKER * live_workers)


def hold(r: redis.Redis, run_id: str, jobs: list[Job], ttl_s: int) -> None:
    """Keep ``jobs`` (the videos beyond the window, in sending order) for finishing tasks to send."""
    if not jobs:
        return
    holder = holder_of(r, run_id, pending.shared_part(jobs[0]), ttl_s)
    for job in jobs:
        holder.add(job)
    holder.close()


def holder_of(r: redis.Redis, run_id: str, shared: dict[str, Any], ttl_s: int) -> pending.Holder:
    """What holds a run's videos beyond its window as they are found (tasks.run.pending.Holder)."""
    return pending.Holder(r, run_id, shared, ttl_s, send=lambda index: send_pending(r, run_id, index, ttl_s))


def drop_pending(r: redis.Redis, run_id: str) -> int:
    """Forget the run's unsent videos (``framefleet cancel``); return how many there were."""
    return pending.drop(r, run_id)


def pending_count(r: redis.Redis, run_id: str) -> int:
    return pending.count(r, run_id)


def finished_count(r: redis.Redis, run_id: str) -> int:
    """How many of the run's videos have finished (each counted once). Raises redis.RedisError."""
    pipe = r.pipeline(transaction=False)
    pipe.hget(key(run_id, keys.RUN_TALLY_SUFFIX), "videos")
    pipe.hlen(key(run_id, keys.RUN_FINISHED_SUFFIX))  # an earlier version's outcomes
    videos, earlier = pipe.execute()
    return int(videos or 0) + int(earlier)


def video_ended(r: redis.Redis, job: Job, ttl_s: int, sender: str | None = None) -> None:
    """Record ``job``'s video in its run's outcomes files and count it in Redis, adding what it adds to the
    run's counters; send the next pending video and, last, the statistics callback.

    ``sender``: the id of the task that ended the video's chain (see ``start_statistics``). The line is
    written before the count: a video counted always has its line (tasks.records.outcome_files).

    Raises OSError when the line cannot be written, redis.RedisError or the broker's error when a message
    cannot be sent (the caller retries the task: every step here may be repeated), JobRefused or
    PathOutsideRoot when the job's ids would put a line anywhere but its own in a file of OUT/runs/ (the
    gate, tasks.pipeline.gate, refuses such jobs before this).
    """
    from tasks.records import outcome_files
    from tasks.run import tally

    run_id = job.run_id
    message = job.to_dict()
    outcome = {k: message[k] for k in OUTCOME_KEYS if k in message}
    vid, status, found = tally.classify(run_id, outcome)
    check_id("run_id", run_id), check_id("video_id", vid)  # a line, and a file name, of their own
    folder = outcome_files.live_dir(Path(job.output_root), run_id)
    runs_dir = Path(job.output_root, manifest.PARTS).resolve()
    if folder.resolve().parent != runs_dir:
        raise PathOutsideRoot(f"run {run_id!r}: its outcomes folder {folder} would leave {runs_dir}; not recorded")
    outcome_files.append(Path(job.output_root), run_id, vid, status, found, outcome.get("notes"))
    _count(r, run_id, outcome, ttl_s, sender)


def video_refused(r: redis.Redis, job: Job, failure: Failure, ttl_s: int, sender: str | None = None) -> bool:
    """Count a video whose job the gate refused as failed in its run, in Redis only (nothing is written
    to OUT: the run's end writes its line, tasks.records.outcome_files.close); return whether it was counted.

    Only a video the run sent and has not counted is (a forged id would end the run early): the run's
    record must exist and the video be in flight in it. Raises redis.RedisError.
    """
    if runs.lookup(r, job.run_id) is None or not r.hexists(sent_key(job.run_id), job.video_id):
        return False
    outcome = {"video_id": job.video_id, "video": job.video, "failed": failure.to_dict()}
    _count(r, job.run_id, outcome, ttl_s, sender)
    return True


def _count(r: redis.Redis, run_id: str, outcome: dict[str, Any], ttl_s: int, sender: str | None) -> None:
    from tasks.celery_app import settings
    from tasks.statistics import sums

    names, args = record_call(run_id, outcome, settings().enabled_stages(), sums.run_shards(r, run_id), ttl_s)
    k, count = r.eval(_RECORD, len(names), *names, *args)
    if not int(k):
        log.warning("run %s has ended: %s delivered again after its end is not counted", run_id, outcome["video_id"])
        return
    send_pending(r, run_id, int(k) - 1, ttl_s)
    found_record = runs.lookup(r, run_id)
    if found_record is None:
        log.error("run %s has no record in Redis (expired or flushed): its statistics are not started", run_id)
        return
    if found_record.get("videos") is not None and int(count) >= int(found_record["videos"]):  # None: still listing
        start_statistics(r, found_record, ttl_s, sender)


_COUNTED = (keys.RUN_TALLY_SUFFIX, keys.RUN_FAILED_SUFFIX, keys.RUN_FINISHED_SUFFIX)


def record_call(
    run_id: str, outcome: dict[str, Any], stages: Sequence[str], shards: int, ttl_s: int
) -> tuple[list[str], list[Any]]:
    """The keys and arguments of the Lua that counts a video (``_RECORD``) for its ``outcome``
    (OUTCOME_KEYS), the run's enabled ``stages`` and its order's ``shards``."""
    from tasks.run import tally

    failure = tally.failure_of(run_id, outcome)
    add, most = tally.counts(outcome, stages) if failure is None else ({}, {})
    counters = [x for pair in add.items() for x in pair] + [x for pair in most.items() for x in pair]
    record = json.dumps(failure, separators=(",", ":")) if failure is not None else ""
    order, mark = order_of(run_id, outcome["video_id"], shards)
    names = [order, sent_key(run_id), runs.redis_key(run_id), *(key(run_id, s) for s in _COUNTED)]
    status = "failed" if failure is not None else "done"
    return names, [outcome["video_id"], mark, ttl_s, status, record, len(add), *counters]


def counted(r: redis.Redis, run_id: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The run's counters (tasks.run.tally.counts summed) and the failure records of its failed videos, by
    video id. Raises redis.RedisError."""
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(key(run_id, keys.RUN_TALLY_SUFFIX))
    pipe.hgetall(key(run_id, keys.RUN_FAILED_SUFFIX))
    fields, failed = pipe.execute()
    text = {_str(k): int(v) for k, v in fields.items()}
    return text, [json.loads(failed[vid]) for vid in sorted(failed)]


def _str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def send_pending(r: redis.Redis, run_id: str, index: int, ttl_s: int) -> bool:
    """Send pending job ``index`` if it is held and was not sent yet; return whether it was sent now."""
    job = pending.take(r, run_id, index)
    if job is None:
        return False
    note_sent(r, [job], ttl_s)
    video_chain(job).apply_async()
    pending.mark_sent(r, run_id, index, ttl_s)  # after the send: a crash in between sends it twice, never zero times
    log.info("sent %s of run %s (pending video %d)", job.video_id, run_id, index)
    return True


def listed(r: redis.Redis, record: dict[str, Any], ttl_s: int) -> bool:
    """Record the run's size once the enqueuer has walked its folder (``record["videos"]``); send the
    statistics callback if every video has finished already. Return whether it was sent now.

    Until then the run's record says ``videos: None`` and no finishing task can end the run. The size is
    published before the count is read, and a finishing task counts before it reads the size: whichever
    comes second sees both, and ``start_statistics`` sends once.
    """
    runs.publish(r, record, ttl_s)
    if finished_count(r, record["run_id"]) >= int(record["videos"]):
        return start_statistics(r, record, ttl_s)
    return False


def start_statistics(r: redis.Redis, record: dict[str, Any], ttl_s: int, sender: str | None = None) -> bool:
    """Send the run's statistics callback unless it was sent already; return whether it was sent now.

    ``sender`` is the id of the task sending it (the redelivery of a task keeps its id): the flag says
    "sending <sender>" until the callback is sent, so a task whose worker died between setting the
    flag and sending finds its own mark when it is delivered again, and sends it then. A second send
    of the same callback id (the worker died after sending, before marking it sent) only writes the
    same statistics and summary again.
    """
    aggregate = app.tasks[TASK_PREFIX + "aggregate"]  # by name: tasks.run.aggregate reads this module
    run_key, flag = runs.redis_key(record["run_id"]), keys.RUN_AGGREGATED_FIELD
    sending = f"sending {sender or '-'}"
    if not r.hsetnx(run_key, flag, sending):
        mark = r.hget(run_key, flag)
        if sender is None or (mark.decode() if isinstance(mark, bytes) else mark) != sending:
            return False
        log.warning(
            "run %s: this task (%s) was sending the statistics callback when its worker stopped; sending it now",
            record["run_id"],
            sender,
        )
    try:
        aggregate.apply_async((callback_run(record),), task_id=record["callback_id"])
    except BaseException:
        r.hdel(run_key, flag)  # not sent: the task's retry must be able to send it
        raise
    pipe = r.pipeline()
    pipe.hset(run_key, flag, f"sent {record['callback_id']}")
    pipe.expire(run_key, ttl_s)
    pipe.execute()
    log.info("run %s: every video finished; statistics callback %s sent", record["run_id"], record["callback_id"])
    return True


def callback_run(record: dict[str, Any]) -> dict[str, Any]:
    """The part of the run's record the statistics callback needs, with the run's seal (tasks.run.seal) when
    its key is in its output folder."""
    from tasks.pipeline.admission import callback_seal

    run = {k: record.get(k) for k in ("run_id", "output_root", "started", "videos", "already_complete")}
    if isinstance(run["run_id"], str) and isinstance(run["output_root"], str):
        sealed = callback_seal(run["run_id"], run["output_root"])
        if sealed is not None:
            run["seal"] = sealed
    return run


def retire(r: redis.Redis, run_id: str, keep_s: int) -> None:
    """Mark the run ended and let its per-video keys go: the done marks and attempts at once, the
    counters and stage log ``keep_s`` seconds from now (its files hold them for good).

    The mark outlives them (the run's hash, ``result_expires_s``): a task of the run delivered
    later is a duplicate, dropped when it starts, and counts nothing (so the flag that guarded the
    callback's send goes too). The record in Redis says "finished", as OUT/runs/ does, so
    `framefleet status --watch RUN` needs neither OUT nor the callback's result. Raises redis.RedisError.
    """
    run_key = runs.redis_key(run_id)
    record = runs.lookup(r, run_id)
    pipe = r.pipeline()
    pipe.hset(run_key, keys.RUN_ENDED_FIELD, f"{time.time():.0f}")
    pipe.hdel(run_key, keys.RUN_AGGREGATED_FIELD)
    if record is not None:
        finished = {**record, "status": "finished", "finished": round(time.time(), 3)}
        pipe.hset(run_key, keys.RUN_RECORD_FIELD, json.dumps(finished, separators=(",", ":")))
    pipe.delete(keys.LEGACY_STAGE_LOG)  # an earlier version's global stage log (no TTL): its runs have snapshots
    from tasks.statistics import sums

    let_go(pipe, run_id, keep_s, shards=sums.shards_of(record))
    pipe.execute()
    if record is not None and record.get("output_root"):
        from tasks.run import hold

        try:
            hold.release(r, Path(record["output_root"]), run_id)  # OUT is free for the next run
        except OSError as exc:
            log.warning("run %s: %s not removed (%s); the next run there finds the run ended", run_id, hold.FILE, exc)


def let_go(pipe: Any, run_id: str, keep_s: int, videos: int = 0, shards: int | None = None) -> None:
    """Queue on ``pipe`` the end of the run's per-video keys: attempts, unsent and sent jobs, the sweep's
    misses, the done marks, the order and the merged marks (over ``shards``, or those of a run of ``videos``)
    now; counters, failures, an earlier version's outcomes, stage log, running sums, requeues and resends
    ``keep_s`` seconds from now (also
    for a cancelled run, whose tasks stop at its flag and which the sweep leaves alone)."""
    from tasks.delivery import marks
    from tasks.statistics import sums

    gone = (
        keys.RUN_DONE_SUFFIX,  # an earlier version's one hash of done marks
        keys.RUN_ORDER_SUFFIX,  # and of the order
        keys.RUN_ATTEMPTS_SUFFIX,
        keys.RUN_PENDING_SUFFIX,
        keys.RUN_PENDING_SENT_SUFFIX,
        keys.RUN_SENT_SUFFIX,
    )
    pipe.delete(*(key(run_id, s) for s in gone), keys.SWEEP_PREFIX + run_id)
    pipe.srem(keys.RUNS_SENDING, run_id)
    count = shards or sums.shard_count(videos)
    named = [*sums.shard_keys(run_id, count), *marks.done_keys(run_id, count), *order_keys(run_id, count)]
    for start in range(0, len(named), 1000):  # by name, never a scan: at most 3 × MAX_SHARDS keys
        pipe.delete(*named[start : start + 1000])
    kept = (
        keys.RUN_TALLY_SUFFIX,
        keys.RUN_FAILED_SUFFIX,
        keys.RUN_FINISHED_SUFFIX,
        keys.RUN_OUTCOME_DICT_SUFFIX,
        keys.RUN_STAGES_SUFFIX,
    )
    for suffix in (*kept, keys.RUN_SUMS_SUFFIX):
        pipe.expire(key(run_id, suffix), max(1, keep_s))
    for listed in (keys.REQUEUES_PREFIX, keys.RESENT_PREFIX):
        pipe.expire(listed + run_id, max(1, keep_s))

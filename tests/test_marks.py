"""A run's done marks and start counts on a real Redis, through the stage task's own hooks: a finished task
delivered again is dropped, every start of an unfinished one is counted, and the marks stay compact."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from celery.exceptions import Ignore

from tasks.delivery import claims, marks
from tasks.errors import WorkerLost
from tasks.job import Job
from tasks.pipeline.claim import Attempts, Claim
from tasks.pipeline.hooks import StageCall, StageFailed
from tasks.run import completion, runs
from tasks.statistics import sums

TTL_S = 30.0


@pytest.fixture
def r(app_on_test_redis) -> redis.Redis:
    yield app_on_test_redis[1]
    claims.HELD.clear()
    claims.PENDING.clear()


def _publish(r: redis.Redis, run_id: str, videos: int) -> dict:
    record = {"run_id": run_id, "videos": videos, "started": time.time(), "shards": sums.shard_count(videos)}
    runs.publish(r, record, 3600)
    return record


def _deliver(task_id: str, job: Job, stage: str = "h5") -> StageCall:
    """One delivery of ``task_id``'s message: its claim, then its start count, as the stage task runs them."""
    from tasks.pipeline import STAGE_TASKS

    task = STAGE_TASKS[stage]
    task.push_request(id=task_id, hostname="cpu@test", retries=0, args=(job.to_dict(),), kwargs={})
    try:
        call = StageCall(task, stage, job, job)
        Claim().before_stage(call)
        Attempts().before_stage(call)
        return call
    finally:
        task.pop_request()


def _worker_died(r: redis.Redis, job: Job, stage: str = "h5") -> None:
    """The delivery's process is gone: nothing of it is held here, and its claim has lapsed."""
    claims.HELD.clear()
    claims.PENDING.clear()
    r.delete(claims.claim_key(job.output_root, job.video_id, stage))


def test_a_finished_task_of_a_sharded_run_is_dropped_when_delivered_again(r):
    """Every task of a 10,000-video run finished once is dropped at its next delivery, each mark in one of
    the run's shards as an 8-byte integer (no task id stored), none of another task's taken for its own."""
    _publish(r, "big", 10_000)
    shards = sums.shard_count(10_000)
    finished = [str(uuid.uuid4()) for _ in range(600)]
    for n, task_id in enumerate(finished):
        key = claims.claim_key("/out", f"v{n}", "h5")
        assert claims.decide(r, key, task_id, "cpu@test", TTL_S, run_id="big").action == "run"
        claims.finish(r, task_id, succeeded=True, done_ttl_s=600)
    for n, task_id in enumerate(finished):
        verdict = claims.decide(r, claims.claim_key("/out", f"v{n}", "h5"), task_id, "cpu@test", TTL_S, run_id="big")
        assert (verdict.action, verdict.why) == ("drop", "it has finished"), (task_id, verdict)
    fresh = claims.decide(r, claims.claim_key("/out", "v0", "h5"), str(uuid.uuid4()), "cpu@test", TTL_S, run_id="big")
    assert fresh.action == "run"  # a resent chain's new task of a finished stage runs (and finds its output made)

    written = [k for k in marks.done_keys("big", shards) if r.exists(k)]
    assert sum(r.scard(k) for k in written) == len(finished) and len(written) > 100
    assert {r.object("encoding", k) for k in written} == {"intset"}
    assert not r.exists("ff:run:big:done") and r.hlen(marks.attempts_key("big")) == 0


def test_starts_are_counted_until_the_task_is_done_then_its_redelivery_is_dropped_uncounted(r):
    """A worker that dies mid-stage leaves a start; the redelivery is the second start; once done, the start
    count goes and a third delivery is dropped at its claim without being counted."""
    _publish(r, "run1", 64)
    job = Job("run1", "clip_00", video="clip_00.mp4", output_root="/data/out", chain=("preprocess", "h5"))
    task_id = str(uuid.uuid4())
    assert _deliver(task_id, job).attempts == 1
    _worker_died(r, job)
    assert _deliver(task_id, job).attempts == 2
    assert r.hget(marks.attempts_key("run1"), task_id) == "2"
    claims.finish(r, task_id, succeeded=True, done_ttl_s=600)
    assert claims.is_done(r, "run1", task_id) and not r.hexists(marks.attempts_key("run1"), task_id)
    with pytest.raises(Ignore):
        _deliver(task_id, job)
    assert not r.hexists(marks.attempts_key("run1"), task_id)  # dropped before its start was counted


def test_a_task_started_more_than_its_retries_allow_stops_as_worker_lost(r, app_on_test_redis):
    conf = app_on_test_redis[0]
    _publish(r, "run2", 64)
    job = Job("run2", "clip_00", video="clip_00.mp4", output_root="/data/out", chain=("preprocess", "h5"))
    task_id = str(uuid.uuid4())
    allowed = conf.stages["h5"].max_retries + 1
    for start in range(1, allowed + 1):
        assert _deliver(task_id, job).attempts == start
        _worker_died(r, job)
    with pytest.raises(StageFailed) as stopped:
        _deliver(task_id, job)
    assert isinstance(stopped.value.failure, WorkerLost), stopped.value.failure
    assert f"started {allowed} times without finishing" in str(stopped.value.failure)


def test_the_run_s_end_deletes_every_done_mark_by_name(r):
    record = _publish(r, "run3", 5_000)
    task_ids = [str(uuid.uuid4()) for _ in range(200)]
    for n, task_id in enumerate(task_ids):
        assert claims.decide(r, claims.claim_key("/o", f"v{n}", "h5"), task_id, "w@h", TTL_S, run_id="run3").action
        claims.finish(r, task_id, succeeded=True, done_ttl_s=600)
    written = [k for k in marks.done_keys("run3", record["shards"]) if r.exists(k)]
    assert written
    completion.retire(r, "run3", keep_s=60)
    assert [k for k in written if r.exists(k)] == []
    assert claims.decide(r, claims.claim_key("/o", "v0", "h5"), task_ids[0], "w@h", TTL_S, run_id="run3").action == (
        "drop"
    )  # the run's end mark stands for them


def test_marks_spread_over_the_shards_and_differ_per_task():
    found = [marks.of("r", str(uuid.uuid4()), 256) for _ in range(20_000)]
    assert len({m.mark for m in found}) == len(found)
    per_shard: dict[str, int] = {}
    for m in found:
        per_shard[m.done_key] = per_shard.get(m.done_key, 0) + 1
        assert 0 <= m.mark < 1 << 63
    assert len(per_shard) == 256 and max(per_shard.values()) < 2 * len(found) / 256


def test_the_claim_counts_the_start_in_its_own_round_trip_and_a_takeover_counts_it_after(r, monkeypatch):
    """A free claim counts the task's start in the same round trip (Attempts then asks Redis nothing); a claim
    taken over from a dead holder is counted by Attempts itself: every start is counted once, either way."""
    from tasks.pipeline import STAGE_TASKS
    from tasks.pipeline import claim as claim_hooks
    from tasks.redis_client import free_port

    _publish(r, "run3", 64)
    job = Job("run3", "clip_00", video="clip_00.mp4", output_root="/data/out", chain=("preprocess", "h5"))
    task_id = str(uuid.uuid4())
    task = STAGE_TASKS["h5"]
    task.push_request(id=task_id, hostname="cpu@test", retries=0, args=(job.to_dict(),), kwargs={})
    try:
        call = StageCall(task, "h5", job, job)
        Claim().before_stage(call)
        with monkeypatch.context() as m:
            gone = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nothing listens there
            m.setattr(claim_hooks, "get_redis", lambda url: gone)
            Attempts().before_stage(call)
    finally:
        task.pop_request()
    assert call.attempts == 1 and r.hget(marks.attempts_key("run3"), task_id) == "1"

    _worker_died(r, job)
    r.set(claims.claim_key(job.output_root, job.video_id, "h5"), f"gpu9@gone {task_id}")  # not registered: dead
    assert _deliver(task_id, job).attempts == 2 and r.hget(marks.attempts_key("run3"), task_id) == "2"

    from tasks.run import cancel

    cancel.request(r, "run3", 600)  # `framefleet cancel`: the next delivery stops at its claim, uncounted
    later = str(uuid.uuid4())
    with pytest.raises(Ignore):
        _deliver(later, Job("run3", "clip_01", video="clip_01.mp4", output_root="/data/out", chain=("h5",)))
    assert not r.hexists(marks.attempts_key("run3"), later)

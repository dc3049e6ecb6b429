"""A run's end in Redis, in-process: the steps tests/test_completion.py reaches through real workers, run here
against the test's Redis (real Celery messages on it), each checked on its own."""

from __future__ import annotations

import time

import pytest
import redis
from kombu.exceptions import OperationalError

from tasks import keys
from tasks.delivery import marks as done_marks
from tasks.delivery import queues
from tasks.job import Job
from tasks.run import cancel, completion, runs
from tasks.run.dataset import build_jobs
from tasks.statistics import sums
from tests.test_completion import configure_for, waiting


def new_run(r: redis.Redis, tmp_path, run_id: str, videos: int, **record) -> tuple[list[Job], dict]:
    entries = [{"video_id": f"v{i}", "path": f"v{i}.mp4"} for i in range(videos)]
    jobs, run = build_jobs(entries, tmp_path, tmp_path / "out", run_id)
    record = {**run, "callback_id": f"callback-{run_id}", **record}
    runs.publish(r, record, 3600)
    return jobs, record


def test_the_default_window_is_four_videos_per_live_worker_and_never_under_32() -> None:
    assert [completion.auto_window(n) for n in (0, 1, 8, 9, 100)] == [32, 32, 32, 36, 400]


def test_held_videos_beyond_a_thousand_keep_their_place_in_the_sending_order(redis_url, monkeypatch, tmp_path):
    """Held in chunks of 256, written 16 chunks at a time: the k-th held video is pending video k,
    whichever chunk and write holds it."""
    from tasks.run import pending

    configure_for(monkeypatch, redis_url)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    jobs, _ = new_run(r, tmp_path, "big", 5000)
    completion.hold(r, "big", jobs, 3600)
    assert completion.pending_count(r, "big") == 5000
    for k in (0, 255, 256, 4095, 4096, 4999):
        assert pending.take(r, "big", k) == jobs[k], k
    assert pending.take(r, "big", 5000) is None
    assert completion.send_pending(r, "big", 1000, 3600)
    sent = [Job.peek(cancel.decode(raw)[2][0]).video_id for _key, raw in queues.waiting(r, "cpu")]
    assert sent == ["v1000"] and pending.take(r, "big", 1000) is None
    assert not completion.send_pending(r, "big", 1000, 3600) and completion.pending_count(r, "big") == 4999


def test_each_finished_video_keeps_its_place_in_a_compact_sharded_order(redis_url, monkeypatch, tmp_path):
    """The k-th video to finish sends pending video k - 1, also when its last task is delivered again; the
    places live in small hashes of 8-byte marks (listpack-encoded), not one hash of every video id."""
    configure_for(monkeypatch, redis_url)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    jobs, record = new_run(r, tmp_path, "big", 3000, shards=sums.shard_count(3000))
    completion.hold(r, "big", jobs[600:], 3600)
    for job in jobs[:300]:
        completion.video_ended(r, job, 3600)
    completion.video_ended(r, jobs[0], 3600)  # redelivered: same place, nothing sent again
    sent = [Job.peek(cancel.decode(raw)[2][0]).video_id for _key, raw in queues.waiting(r, "cpu")]
    assert sorted(sent) == sorted(j.video_id for j in jobs[600:900]) and completion.pending_count(r, "big") == 2100
    places = [k for k in completion.order_keys("big", record["shards"]) if r.exists(k)]
    assert sum(r.hlen(k) for k in places) == 300 and {r.object("encoding", k) for k in places} == {"listpack"}
    assert not r.exists(completion.key("big", keys.RUN_ORDER_SUFFIX))


def test_the_statistics_callback_carries_what_it_needs_of_the_runs_record(redis_url, monkeypatch, tmp_path):
    configure_for(monkeypatch, redis_url)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    _, record = new_run(r, tmp_path, "cb", 2, already_complete=1)
    assert completion.start_statistics(r, record, 3600)
    raw = [m for _key, m in queues.waiting(r, "cpu")]
    assert [cancel.decode(m)[:2] for m in raw] == [("framefleet.aggregate", "callback-cb")]
    assert cancel.decode(raw[0])[2] == [
        {
            "run_id": "cb",
            "output_root": record["output_root"],
            "started": record["started"],
            "videos": 2,
            "already_complete": 1,
        }
    ]
    assert record["output_root"] and record["started"]  # the values compared are real ones


def test_a_callback_the_broker_refused_can_be_sent_by_the_tasks_retry(redis_url, monkeypatch, tmp_path):
    """The broker refuses the message (here its queue's key holds a string, as an out-of-memory Redis or a
    read-only replica refuses a write): the flag goes, so the last task's retry sends the callback, once."""
    configure_for(monkeypatch, redis_url)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    _, record = new_run(r, tmp_path, "refused", 1)
    r.set("cpu", "not a queue")
    with pytest.raises(OperationalError, match="WRONGTYPE"):  # kombu's, as a worker's send raises it
        completion.start_statistics(r, record, 3600, sender="task-a")
    assert r.hget(runs.redis_key("refused"), keys.RUN_AGGREGATED_FIELD) is None
    r.delete("cpu")
    assert completion.start_statistics(r, record, 3600, sender="task-a")
    assert completion.start_statistics(r, record, 3600, sender="task-a") is False
    assert waiting(r) == [("framefleet.aggregate", "callback-refused")]
    assert r.hget(runs.redis_key("refused"), keys.RUN_AGGREGATED_FIELD) == "sent callback-refused"


def test_a_retired_run_is_finished_in_redis_and_lets_its_per_video_keys_go(redis_url, monkeypatch, tmp_path):
    configure_for(monkeypatch, redis_url)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    jobs, record = new_run(r, tmp_path, "old", 200)  # 200 videos: their merged marks span 4 shards
    completion.hold(r, "old", jobs[100:], 3600)
    completion.note_sent(r, jobs[:2], 3600)
    for job in jobs[:2]:
        completion.video_ended(r, job, 3600)
    marks = sums.shard_keys("old", sums.shard_count(200))
    assert len(marks) == 4
    for key in marks:
        r.hset(key, "mark", "stamp")
    run_key = runs.redis_key("old")
    now_gone = [completion.key("old", s) for s in (keys.RUN_DONE_SUFFIX, keys.RUN_ATTEMPTS_SUFFIX)]
    for key in now_gone:
        r.hset(key, "task-1", 1)
    now_gone += done_marks.done_keys("old", sums.shard_count(200))
    for key in now_gone[2:]:
        r.sadd(key, 7)
    places = [k for k in completion.order_keys("old", sums.shard_count(200)) if r.exists(k)]
    assert places  # jobs[:2]'s places in the order
    now_gone += places
    r.hset(keys.SWEEP_PREFIX + "old", "v5", time.time())
    r.rpush(keys.LEGACY_STAGE_LOG, "span")
    kept = [completion.key("old", s) for s in (keys.RUN_STAGES_SUFFIX, keys.RUN_SUMS_SUFFIX)]
    kept += [keys.REQUEUES_PREFIX + "old", keys.RESENT_PREFIX + "old"]
    for key in kept:
        r.rpush(key, "x") if not key.endswith(keys.RUN_SUMS_SUFFIX) else r.hset(key, "3d", "x")
    kept += [completion.key("old", keys.RUN_TALLY_SUFFIX)]  # the run's counters: the summary is written from them
    r.hset(run_key, keys.RUN_AGGREGATED_FIELD, "sent callback-old")

    before = time.time()
    completion.retire(r, "old", 3600)
    after = time.time()

    assert r.hget(run_key, keys.RUN_ENDED_FIELD) and not r.hexists(run_key, keys.RUN_AGGREGATED_FIELD)
    finished = runs.lookup(r, "old")
    assert finished == {**record, "status": "finished", "finished": finished["finished"]}
    assert before - 0.001 <= finished["finished"] <= after + 0.001
    gone = [*now_gone, *marks, keys.SWEEP_PREFIX + "old", keys.LEGACY_STAGE_LOG]
    gone += [completion.key("old", s) for s in (keys.RUN_PENDING_SUFFIX, keys.RUN_SENT_SUFFIX)]
    assert [key for key in gone if r.exists(key)] == []
    assert {key: 3500 < r.ttl(key) <= 3600 for key in kept} == dict.fromkeys(kept, True)
    completion.video_ended(r, jobs[2], 3600)  # a task of the run delivered after its end counts nothing
    assert completion.counted(r, "old")[0]["videos"] == 2


def test_a_held_video_is_noted_for_the_sweep_before_its_chain_is_published(redis_url, monkeypatch, tmp_path):
    """note_sent precedes the send: a host lost between the two leaves a video the sweep finds noted and
    nowhere, so it sends it; noted after, the sweep would never learn of a message lost in the send."""
    from celery.signals import before_task_publish

    configure_for(monkeypatch, redis_url)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    jobs, _ = new_run(r, tmp_path, "noted", 3)
    completion.hold(r, "noted", jobs, 3600)
    noted_at_publish: list[bool] = []

    def publishing(**_kwargs) -> None:
        noted_at_publish.append(r.hexists(completion.sent_key("noted"), "v1"))

    before_task_publish.connect(publishing, weak=False)
    try:
        assert completion.send_pending(r, "noted", 1, 3600)
    finally:
        before_task_publish.disconnect(publishing)
    assert noted_at_publish == [True]

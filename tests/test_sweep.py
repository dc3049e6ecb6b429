"""The sweep of runs in flight: a video whose message is nowhere is sent again, once, and recorded.

A real Redis; the last two tests run real workers and a real run.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
import redis

from tasks.delivery import leases, queues
from tasks.job import Job
from tasks.run import cancel, completion, sweep
from tasks.workers import registry
from tests.conftest import run_script, settings_env, start_redis_server, wait_for_run_end, wait_until


def _job(tmp_path, vid: str, run_id: str = "r1") -> Job:
    return Job(
        run_id=run_id,
        video_id=vid,
        video=f"{vid}.mp4",
        dataset_root=str(tmp_path / "raw"),
        output_root=str(tmp_path / "out"),
        chain=("preprocess", "depth", "tracks", "hands", "h5"),
    )


@pytest.fixture
def swept(app_on_test_redis, monkeypatch):
    """Settings whose lease TTL lets a young Redis be swept, and no wait between the two sightings."""
    conf, r = app_on_test_redis
    monkeypatch.setattr(sweep, "CONFIRM_S", 0.0)
    wait_until(lambda: leases.redis_uptime_s(r) >= 1, 5, "the test Redis a second old")  # swept from then on
    return conf.model_copy(update={"lease_ttl_s": 0.5}), r


def _waiting_videos(r: redis.Redis, queue: str) -> list[str]:
    return [Job.peek(cancel.decode(raw)[2][0]).video_id for _key, raw in queues.waiting(r, queue)]


def test_a_video_missing_on_two_sweeps_is_sent_again_from_its_first_unfinished_stage(swept, tmp_path):
    conf, r = swept
    queued, lost = _job(tmp_path, "a"), _job(tmp_path, "b")
    completion.note_sent(r, [queued, lost], 3600)
    from tasks.run.dataset import video_chain

    video_chain(queued).apply_async()  # a's message waits in the cpu queue; b's was never sent
    assert sweep.sweep(r, r, conf, force=True) == []  # b missed once: not yet
    assert set(r.hkeys("ff:sweep:r1")) == {"b"}
    again = sweep.sweep(r, r, conf, force=True)
    assert [(e["video_id"], e["stage"]) for e in again] == [("b", "preprocess")]
    assert sorted(_waiting_videos(r, conf.cpu_queue)) == ["a", "b"]
    assert sweep.sweep(r, r, conf, force=True) == []  # its message is there now
    assert [e["video_id"] for e in sweep.resent(r, "r1")] == ["b"]


def test_a_video_missed_once_is_resent_only_by_a_sweep_confirm_s_after_the_first_miss(swept, tmp_path, monkeypatch):
    """Two sightings CONFIRM_S apart, not two sweeps in a row: a video nowhere for a moment is not taken for lost."""
    conf, r = swept
    monkeypatch.setattr(sweep, "CONFIRM_S", 5.0)
    completion.note_sent(r, [_job(tmp_path, "b")], 3600)
    assert sweep.sweep(r, r, conf, force=True) == []
    first_miss = float(r.hget("ff:sweep:r1", "b"))
    assert sweep.sweep(r, r, conf, force=True) == []  # less than CONFIRM_S later
    r.hset("ff:sweep:r1", "b", first_miss - sweep.CONFIRM_S)  # as if the first sweep had run CONFIRM_S earlier
    assert [e["video_id"] for e in sweep.sweep(r, r, conf, force=True)] == ["b"]


def test_a_video_found_again_is_forgotten_and_finished_or_cancelled_runs_are_not_swept(swept, tmp_path):
    conf, r = swept
    job = _job(tmp_path, "a")
    completion.note_sent(r, [job], 3600)
    assert sweep.sweep(r, r, conf, force=True) == []
    from tasks.statistics import sums

    r.hset(*completion.order_of("r1", "a", sums.run_shards(r, "r1")), 1)  # its end was counted meanwhile: its place
    assert sweep.sweep(r, r, conf, force=True) == [] and not r.hkeys("ff:sweep:r1")
    completion.note_sent(r, [_job(tmp_path, "c", "r2")], 3600)
    r.set("ff:cancelled:r2", "1")
    assert sweep.active_runs(r) == ["r1"]


def test_a_video_counted_in_any_shard_of_a_large_run_is_not_in_flight(swept, tmp_path):
    """A run of many videos keeps its order in shards (its record fixes how many): a finished video is looked up
    in its own shard; looked up as for a one-shard run, most finished videos would seem lost and be sent again."""
    from tasks.run import runs
    from tasks.statistics import sums

    conf, r = swept
    runs.publish(r, {"run_id": "big-run", "started": time.time(), "shards": 8}, 3600)
    jobs = [_job(tmp_path, f"v{i:02d}", "big-run") for i in range(24)]
    completion.note_sent(r, jobs, 3600)
    finished = [job.video_id for job in jobs[:18]]
    for vid in finished:
        r.hset(*completion.order_of("big-run", vid, 8), 1)
    assert len({completion.order_of("big-run", vid, 8)[0] for vid in finished}) > 1  # spread over shards
    assert sums.run_shards(r, "big-run") == 8
    assert sorted(sweep.in_flight(r, "big-run")) == [job.video_id for job in jobs[18:]]
    sweep.sweep(r, r, conf, force=True)
    resent = {e["video_id"] for e in sweep.sweep(r, r, conf, force=True)}
    assert resent == {job.video_id for job in jobs[18:]}  # the lost ones only, never a finished one


def test_the_sweep_finds_its_runs_without_a_scan_of_every_key(swept, tmp_path):
    """The runs in flight come from the set of runs that sent videos; one whose sent hash is gone leaves it.
    Beside a million-video run's 130,000 keys a scan of every key took a round trip per 500 keys."""
    conf, r = swept
    completion.note_sent(r, [_job(tmp_path, "a", "r1"), _job(tmp_path, "b", "r2")], 3600)
    for n in range(2000):
        r.sadd(f"ff:run:r1:done:{n:x}", n)  # a live run's other keys
    r.config_resetstat()
    assert sweep.active_runs(r) == ["r1", "r2"]
    assert "cmdstat_scan" not in r.info("commandstats") and "cmdstat_keys" not in r.info("commandstats")
    r.delete(completion.sent_key("r2"))  # its videos all counted
    assert sweep.active_runs(r) == ["r1"] and r.smembers("ff:runs-sending") == {"r1"}
    completion.note_sent(r, [_job(tmp_path, "c", "r2")], 3600)  # its next video sent: swept again
    assert sweep.active_runs(r) == ["r1", "r2"]


def test_a_held_message_or_a_running_task_accounts_for_its_video(swept, tmp_path):
    conf, r = swept
    held, running = _job(tmp_path, "a"), _job(tmp_path, "b")
    completion.note_sent(r, [held, running], 3600)
    from tasks.run.dataset import video_chain

    video_chain(held).apply_async()
    key, raw = queues.waiting(r, conf.cpu_queue)[0]
    r.lrem(key, 0, raw)  # as a worker's pop does: into unacked
    message = json.loads(raw)
    r.hset("unacked", message["properties"]["delivery_tag"], json.dumps([message, "", conf.cpu_queue]))
    registry.publish(r, {"hostname": "w@test", "current": {"run": "r1", "video": "b"}}, ttl_s=60)
    assert sweep.located(r, r, conf) >= {("r1", "a"), ("r1", "b")}


def test_one_sweep_at_a_time_over_every_host_and_not_again_within_sweep_every_s(swept, tmp_path):
    conf, r = swept
    completion.note_sent(r, [_job(tmp_path, "b")], 3600)  # b's message is nowhere
    assert sweep.sweep(r, r, conf) == [] and set(r.hkeys("ff:sweep:r1")) == {"b"}  # a sweep: b's first miss
    assert sweep.sweep(r, r, conf) == []  # another host's, within SWEEP_EVERY_S: nothing, though CONFIRM_S is 0
    assert 0 < r.pttl(sweep.LOCK) <= sweep.SWEEP_EVERY_S * 1000
    r.delete(sweep.LOCK)  # SWEEP_EVERY_S later
    assert [e["video_id"] for e in sweep.sweep(r, r, conf)] == ["b"]


def test_nothing_is_swept_while_either_redis_is_younger_than_a_lease_ttl(swept, tmp_path):
    """After a restart, a message a live worker holds is seen only once the worker re-registers (within a lease
    TTL): a sweep before then would resend videos that are running."""
    conf, r = swept
    completion.note_sent(r, [_job(tmp_path, "b")], 3600)  # b's message is nowhere: a sweep would miss it
    young = conf.model_copy(update={"lease_ttl_s": leases.redis_uptime_s(r) + 3600})
    assert sweep.sweep(r, r, young, force=True) == [] and sweep.sweep(r, r, young, force=True) == []
    assert not r.hkeys("ff:sweep:r1")  # not even a first miss kept
    # The broker alone young (a fresh server), the results Redis older than the TTL.
    wait_until(lambda: leases.redis_uptime_s(r) >= 10, 15, "the test Redis 10 s old")
    url, stop = start_redis_server()
    try:
        broker = redis.Redis.from_url(url)
        broker_young = conf.model_copy(update={"lease_ttl_s": leases.redis_uptime_s(r)})
        assert sweep.sweep(r, broker, broker_young, force=True) == []
        assert sweep.sweep(r, broker, broker_young, force=True) == [] and not r.hkeys("ff:sweep:r1")
        assert leases.redis_uptime_s(broker) < broker_young.lease_ttl_s  # it was young throughout
    finally:
        stop()
    assert sweep.sweep(r, r, conf, force=True) == []  # both old: b's first miss, then its resend
    assert [e["video_id"] for e in sweep.sweep(r, r, conf, force=True)] == ["b"]


def _made(job: Job, *stages: str) -> None:
    """Write each of ``stages``' outputs of ``job``'s video with its completion marker, as a finished stage does."""
    from tasks.outputs.stage_io import marker_of, output_path
    from tasks.outputs.storage import sha256_file, write_marker

    out_root = Path(job.output_root)
    for stage in stages:
        output = output_path(out_root, job.video_id, stage)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_bytes(f"{job.video_id} {stage}".encode())
        marker = marker_of(out_root, job.video_id, stage)
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_marker(output, sha256_file(output), marker)


def test_no_video_is_resent_whose_message_waits_third_in_its_list_or_behind_one_the_sweep_cannot_read(swept, tmp_path):
    conf, r = swept
    jobs = [_job(tmp_path, vid) for vid in ("a", "b", "c")]
    completion.note_sent(r, jobs, 3600)
    from tasks.run.dataset import video_chain

    for job in jobs:
        video_chain(job).apply_async()  # all three wait in one list of the cpu queue
    [key] = {key for key, _raw in queues.waiting(r, conf.cpu_queue)}
    r.lpush(key, "not a kombu message")  # another program's, or damaged: read before the three
    assert sweep.sweep(r, r, conf, force=True) == [] and not r.hkeys("ff:sweep:r1")
    assert sweep.sweep(r, r, conf, force=True) == [] and sweep.resent(r, "r1") == []  # none sent twice
    assert r.lindex(key, 0) == "not a kombu message"  # left where it was


def test_a_lost_video_is_sent_again_with_the_rest_of_its_chain_and_every_resend_is_recorded(swept, tmp_path):
    conf, r = swept
    made, fresh, third = _job(tmp_path, "b"), _job(tmp_path, "c"), _job(tmp_path, "d")
    _made(made, "preprocess")  # its preprocess finished before its depth message was lost
    completion.note_sent(r, [made, fresh, third], 3600)
    assert sweep.sweep(r, r, conf, force=True) == []
    before = time.time()
    again = sweep.sweep(r, r, conf, force=True)
    after = time.time()
    assert [(e["video_id"], e["video"], e["stage"]) for e in again] == [
        ("b", "b.mp4", "depth"),
        ("c", "c.mp4", "preprocess"),
        ("d", "d.mp4", "preprocess"),
    ]
    assert all(before <= e["time"] <= after for e in again)
    assert sweep.resent(r, "r1") == again  # the run's summary lists all three, oldest first
    [(_key, raw)] = queues.waiting(r, "gpu0")  # no GPU worker: depth waits on the first GPU
    name, _id, args = cancel.decode(raw)
    assert (name, Job.peek(args[0]).video_id) == ("framefleet.depth", "b")
    _args, _kwargs, embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
    # Celery keeps the stages still to come last first.
    assert [task["task"] for task in reversed(embed["chain"])] == [
        "framefleet.tracks",
        "framefleet.hands",
        "framefleet.h5",
    ]


def test_a_lost_video_with_every_output_made_is_sent_to_its_last_stage_and_one_of_a_forced_run_to_its_first(
    swept, tmp_path
):
    """The last stage of a video whose outputs are all made still counts its end; a forced run makes them again."""
    import dataclasses

    conf, r = swept
    made = _job(tmp_path, "a")
    forced = dataclasses.replace(_job(tmp_path, "b", "r2"), force=True)
    for job in (made, forced):
        _made(job, *job.chain)
    completion.note_sent(r, [made, forced], 3600)
    assert sweep.sweep(r, r, conf, force=True) == []
    assert [(e["video_id"], e["stage"]) for e in sweep.sweep(r, r, conf, force=True)] == [
        ("a", "h5"),
        ("b", "preprocess"),
    ]


def test_runs_whose_videos_are_all_counted_or_whose_statistics_were_sent_are_not_swept(swept, tmp_path):
    """Whichever run comes first in the set, the runs after it are still read."""
    _, r = swept
    from tasks import keys
    from tasks.run import runs

    completion.note_sent(r, [_job(tmp_path, "a", run) for run in ("r1", "r2", "r3", "r4")], 3600)
    r.delete(completion.sent_key("r1"))  # its videos all counted
    r.hset(runs.redis_key("r2"), keys.RUN_AGGREGATED_FIELD, "sent cb")  # its statistics callback sent
    r.hset(runs.redis_key("r3"), keys.RUN_ENDED_FIELD, "1")  # its files written (the flag above then goes)
    assert sweep.active_runs(r) == ["r4"]
    assert r.smembers(keys.RUNS_SENDING) == {"r2", "r3", "r4"}


VIDEO_TIMEOUT_S = 240
# Depth waits (no CPU taken) 2 s a frame, 32 s a video: long enough to resend it while it runs.
SLOW_DEPTH = "stages:\n  depth:\n    params: {seconds_per_frame: 2.0}\n"


def test_a_run_whose_message_is_deleted_by_hand_finishes_on_its_own(video_factory, workers, pipeline_env, tmp_path):
    raw = video_factory(1)
    env = settings_env(tmp_path, "", FRAMEFLEET_LEASE_TTL_S="3")
    workers.start("cpu", env=env)  # no GPU worker yet: the depth message waits in gpu0's queue
    out = tmp_path / "out"
    enqueued = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--no-wait", env={**pipeline_env, **env})
    assert enqueued.returncode == 0, enqueued.stderr
    broker = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    key, message = wait_until(lambda: (queues.waiting(broker, "gpu0") or [None])[0], 120, "the depth message")
    assert broker.lrem(key, 0, message) == 1  # gone: a hand, a Redis from an older save, a send that failed
    workers.start("gpu0", env=env)
    summary = wait_for_run_end(out, VIDEO_TIMEOUT_S)  # without its depth message
    assert summary["done"] == 1 and summary["failed"] == []
    assert [e["stage"] for e in summary["resent"]] == ["depth"]
    assert summary["resent"][0]["video_id"] == summary["done_videos"][0]
    assert not broker.hlen(completion.sent_key(summary["run_id"]))  # a finished video is no longer in flight


def test_a_resend_of_a_stage_running_elsewhere_waits_for_its_claim_and_never_runs_it_twice(
    video_factory, workers, pipeline_env, app_on_test_redis, tmp_path
):
    """The sweep misjudging a running video (say, its worker's state unreadable for two sweeps) costs a wait."""
    import dataclasses

    raw = video_factory(1)
    env = settings_env(tmp_path, SLOW_DEPTH, FRAMEFLEET_LEASE_TTL_S="3")
    for queue in ("cpu", "gpu0", "gpu1"):
        workers.start(queue, env=env)
    out = tmp_path / "out"
    # --gpus 0: the run's GPU stages go to gpu0; gpu1 idles, ready for the resend.
    enqueued = run_script(
        "enqueue_dataset.py", str(raw), "--out", str(out), "--gpus", "0", "--no-wait", env={**pipeline_env, **env}
    )
    assert enqueued.returncode == 0, enqueued.stderr
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    wait_until(
        lambda: ((workers.state("gpu0") or {}).get("current") or {}).get("task") == "framefleet.depth", 120, "depth"
    )
    [run_id] = sweep.active_runs(r)
    [job] = sweep.in_flight(r, run_id).values()
    # To the idle GPU, while gpu0 runs it: the job's GPUs changed as its enqueue would have sealed them.
    from tasks.run import seal

    key = seal.read_key(out, run_id)
    assert key is not None
    entry = sweep.resend(r, seal.sealed(key, dataclasses.replace(job, gpus=(1,))), 3600)
    assert entry["stage"] == "depth"
    summary = wait_for_run_end(out, VIDEO_TIMEOUT_S)
    assert summary["done"] == 1 and summary["failed"] == []
    logs = {name: workers.log(name) for name in ("gpu0", "gpu1")}
    assert "is being made by gpu0@test" in logs["gpu1"]  # the second delivery met the claim and waited
    assert sum(log.count(f"ran depth of {job.video_id}") for log in logs.values()) == 1

"""Redis full (maxmemory reached, noeviction) or read-only: named with its fix, and a worker started then stops with
its own exit status; a heartbeat and a stage's unsendable retry name it too; a real redis-server, `CONFIG SET
maxmemory`. The enqueuer's stop and `--continue` once Redis
has room: tests/faults/test_redis_full_faults.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tasks.redis_refusal import EXIT_STATUS, refusal
from tests.conftest import Workers, process_env, run_script, start_redis_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def own_redis() -> Iterator[str]:
    """A redis-server of this test alone: its memory limit is changed, which no other test may see."""
    url, stop = start_redis_server()
    yield f"{url}/0"
    stop()


def fill(r: redis.Redis) -> None:
    """Put Redis past its maxmemory, as a full Redis is: a 32 MB key under a 16 MB limit (below the key alone:
    client buffers freed later do not give it room again)."""
    r.set("ballast", b"x" * 32_000_000)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", str(16_000_000))


def test_refusals_are_named_with_their_fix_and_other_errors_are_not(own_redis):
    r = redis.Redis.from_url(own_redis)
    fill(r)
    with pytest.raises(redis.RedisError) as full:
        r.rpush("ff:some-queue", "a task")
    assert "maxmemory" in (refusal(full.value) or "") and "CONFIG SET maxmemory" in (refusal(full.value) or "")
    with pytest.raises(redis.RedisError) as in_script:  # framefleet's claims and leases are Lua scripts
        r.eval("return redis.call('SET', KEYS[1], ARGV[1])", 1, "ff:claim", "w1")
    assert "maxmemory" in (refusal(in_script.value) or "")
    r.config_set("maxmemory", "0")
    r.execute_command("REPLICAOF", "127.0.0.1", "1")  # a replica (of nothing that answers) refuses writes
    try:
        with pytest.raises(redis.RedisError) as read_only:
            r.set("ff:x", "1")
        assert "read-only" in (refusal(read_only.value) or "") and "primary" in (refusal(read_only.value) or "")
    finally:
        r.execute_command("REPLICAOF", "NO", "ONE")
    assert refusal(redis.ConnectionError("Connection refused")) is None
    assert refusal(redis.ResponseError("WRONGTYPE Operation against a key")) is None


def test_a_worker_started_while_redis_is_full_names_the_cause_and_exits_with_its_status(own_redis, tmp_path):
    workers = Workers(process_env(own_redis), tmp_path / "logs")
    fill(redis.Redis.from_url(own_redis))
    try:
        proc = workers.start("cpu", wait=False)
        assert proc.wait(timeout=90) == EXIT_STATUS, workers.log("cpu")
        log = workers.log("cpu")
        assert "the worker does not start: Redis is full" in log and "CONFIG SET maxmemory" in log
        assert "Traceback" not in log and "Unrecoverable error" not in log
    finally:
        workers.stop_all()


def test_a_worker_started_a_few_kb_below_maxmemory_stops_naming_the_cause_without_a_traceback(own_redis, tmp_path):
    """The probe's small write fits; the worker's own connections then fill the rest, and kombu's first write as the
    consumer connects (its mutex, a pipeline) is refused: Celery's "Unrecoverable error" and exit 1 before."""
    workers = Workers(process_env(own_redis), tmp_path / "logs")
    r = redis.Redis.from_url(own_redis)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", str(int(r.info("memory")["used_memory"]) + 60_000))
    try:
        proc = workers.start("cpu", wait=False)
        assert proc.wait(timeout=90) == EXIT_STATUS, workers.log("cpu")
        log = workers.log("cpu")
        assert "Redis is full" in log and "CONFIG SET maxmemory" in log
        assert "Traceback" not in log and "Unrecoverable error" not in log
    finally:
        workers.stop_all()


def test_framefleet_run_on_a_full_redis_stops_before_starting_a_worker(own_redis, video_factory, tmp_path):
    fill(redis.Redis.from_url(own_redis))
    out = tmp_path / "out"
    done = run_script("run_local.py", str(video_factory(1)), "--out", str(out), env=process_env(own_redis))
    assert done.returncode == EXIT_STATUS, done.stdout + done.stderr
    assert "Redis is full" in done.stderr and "Traceback" not in done.stderr
    assert f"--out {out} --continue` finishes the run" in done.stderr
    assert not list((out / "logs").glob("cpu*.log")) and not list((out / "logs").glob("gpu*.log"))


@pytest.fixture
def app_on_own_redis(own_redis, monkeypatch):
    """This process's Celery app and settings on ``own_redis``; put back on the tests' Redis afterwards."""
    from tasks import configure
    from worker_config.settings import load_settings

    monkeypatch.setenv("REDIS_URL", own_redis)
    configure(load_settings())
    yield redis.Redis.from_url(own_redis)
    monkeypatch.undo()
    configure(load_settings())


def test_a_stage_whose_retry_redis_refuses_fails_naming_the_full_redis_its_fix_and_continue(app_on_own_redis):
    """A claim that lapsed while Redis was full cannot be confirmed, and its retry cannot be sent: the video's failure
    record says why, the fix and that --continue finishes it (it said "the stage will run again")."""
    from tasks.delivery import claims
    from tasks.errors import ClaimUnconfirmed, RedisUnavailable
    from tasks.job import Job
    from tasks.pipeline import STAGE_TASKS
    from tasks.pipeline.hooks import StageCall
    from tasks.pipeline.retries import Retries

    key = claims.claim_key("/data/out", "clip_00", "depth")
    claims.HELD[key] = "gpu0@hostB task-1"  # held, and lapsed (not in Redis) while Redis was full
    fill(app_on_own_redis)
    try:
        with pytest.raises(ClaimUnconfirmed) as unconfirmed:
            claims.confirm(app_on_own_redis, key, 30)
        task = STAGE_TASKS["depth"]
        job = Job("run-1", "clip_00", video="clip_00.mp4", output_root="/data/out", chain=("preprocess", "depth"))
        task.push_request(id="task-1", retries=0, args=(job.to_dict(),), kwargs={}, called_directly=False)
        try:
            failure = Retries().after_failure(StageCall(task, "depth", job, job), unconfirmed.value)
        finally:
            task.pop_request()
    finally:
        claims.HELD.clear()
    assert isinstance(failure, RedisUnavailable)
    assert "Redis is full" in str(failure) and "CONFIG SET maxmemory" in str(failure)
    assert str(failure).endswith("enqueue again with --continue once Redis takes writes")
    assert "will run again" not in str(failure)  # its retry was refused: nothing runs it again but --continue


def test_a_heartbeat_on_a_full_redis_logs_the_cause_and_fix_without_a_traceback(app_on_own_redis, caplog):
    """A worker whose Redis fills up mid-task logged a traceback for each part of each tick (three every heartbeat)."""
    from tasks import app
    from tasks.celery_app import settings
    from tasks.workers.heartbeat import Heartbeat

    fill(app_on_own_redis)
    beat = Heartbeat(app, lambda: {"hostname": "gpu0@test", "busy": True})
    with caplog.at_level("WARNING", logger="framefleet.heartbeat"):
        beat.tick(settings())
    failed = [rec for rec in caplog.records if rec.name == "framefleet.heartbeat"]
    assert [rec.getMessage().partition(":")[0] for rec in failed] == [
        "publishing the worker state failed (1 so far; said again in 60 s if it lasts)"
    ]
    assert "Redis is full" in failed[0].getMessage() and "CONFIG SET maxmemory" in failed[0].getMessage()
    assert failed[0].exc_info is None and beat.redis_back_at is None  # no reaping until Redis has taken writes again
    caplog.clear()
    with caplog.at_level("WARNING", logger="framefleet.heartbeat"):
        beat.tick(settings())  # still full, a tick later: counted, not said again within the minute
    assert [rec for rec in caplog.records if rec.name == "framefleet.heartbeat"] == [] and beat.errors == 2
    beat.refusal_said["publishing the worker state"] -= 60  # a minute later it is said again
    with caplog.at_level("WARNING", logger="framefleet.heartbeat"):
        beat.tick(settings())
    assert [rec.getMessage().partition(":")[0] for rec in caplog.records] == [
        "publishing the worker state failed (3 so far; said again in 60 s if it lasts)"
    ]

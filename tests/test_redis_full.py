"""Redis full (maxmemory reached, noeviction) or read-only: a clear stop with its own exit status, then
`--continue` finishes the run once Redis has room; a real redis-server, real workers, `CONFIG SET maxmemory`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from tasks.redis_refusal import EXIT_STATUS, refusal
from tests.conftest import Workers, process_env, run_script, start_redis_server

pytestmark = pytest.mark.timeout(240)


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


def test_enqueue_into_a_full_redis_stops_clearly_and_continue_finishes_once_it_has_room(
    own_redis, video_factory, tmp_path
):
    env = process_env(own_redis)
    workers = Workers(env, tmp_path / "logs")
    try:
        workers.start("cpu")
        workers.start("gpu0")
        raw, out = video_factory(2), tmp_path / "out"
        r = redis.Redis.from_url(own_redis)
        fill(r)
        stopped = run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=env, timeout_s=120)
        assert stopped.returncode == EXIT_STATUS, stopped.stdout + stopped.stderr
        assert "Traceback" not in stopped.stderr, stopped.stderr
        assert "Redis is full" in stopped.stderr and "CONFIG SET maxmemory" in stopped.stderr
        assert f"--out {out} --continue` finishes the run" in stopped.stderr
        assert not list(out.glob("*.hdf5"))

        r.config_set("maxmemory", "0")  # room again
        r.delete("ballast")
        done = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--continue", env=env, timeout_s=200)
        assert done.returncode == 0, done.stdout + done.stderr
        summary = json.loads((out / "run_summary.json").read_text())
        assert summary["done"] + summary["already_complete"] == 2 and summary["failed"] == []
        assert len(list(out.glob("*.hdf5"))) == 2
    finally:
        workers.stop_all()

"""The enqueuer against a full Redis (maxmemory reached, noeviction): a clear stop with exit status 5 and nothing
lost, then `--continue` finishes the run once Redis has room; a real redis-server, real workers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from tasks.redis_refusal import EXIT_STATUS
from tests.conftest import Workers, process_env, run_script, start_redis_server
from tests.test_redis_full import fill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def own_redis() -> Iterator[str]:
    """A redis-server of this test alone: its memory limit is changed, which no other test may see."""
    url, stop = start_redis_server()
    yield f"{url}/0"
    stop()


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

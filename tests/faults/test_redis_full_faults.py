"""A full Redis (maxmemory reached, noeviction), at enqueue and while a stage runs: a clear stop (exit status 5) or
a video failed naming the cause and fix, nothing lost, and `--continue` finishes the run once Redis has room; a real
redis-server, real workers."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis

from tasks.delivery import claims
from tasks.redis_refusal import EXIT_STATUS
from tests.conftest import (
    Workers,
    enqueue_and_watch,
    process_env,
    run_script,
    settings_env,
    start_redis_server,
    wait_until,
)
from tests.faults.conftest import assert_nothing_lost, record, stage_runs, twice
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


def _running(workers: Workers, name: str, task: str) -> str | None:
    """The video whose ``task`` worker ``name`` runs now, as its registry entry says; None when it runs no such task."""
    current = (workers.state(name) or {}).get("current") or {}
    return current["video"] if current.get("task") == task else None


# 6.4 s of depth per video, waited rather than computed; a claim or lease lapses 2 s after its last renewal.
LONG_DEPTH_SHORT_LEASES = "lease_ttl_s: 2\nstages:\n  depth:\n    params: {seconds_per_frame: 0.4}\n"


@pytest.mark.ci_fault
def test_redis_full_while_a_stage_runs_fails_that_video_clearly_and_continue_finishes_once_it_has_room(
    own_redis, video_factory, tmp_path
):
    """Redis fills up while depth runs and stays full past the lease and registry TTLs, so depth ends unable to take
    its lapsed claim back: its output is discarded and its retry refused, and the video fails naming the full Redis,
    its fix and --continue (docs/security.md); the other video, the workers and every file ride it out."""
    env = {**process_env(own_redis), **settings_env(tmp_path, LONG_DEPTH_SHORT_LEASES)}
    workers = Workers(env, tmp_path / "logs")
    following: subprocess.Popen[str] | None = None
    try:
        workers.start("cpu")
        workers.start("gpu0")
        raw, out = video_factory(2), tmp_path / "out"
        following = enqueue_and_watch(raw, out, env)
        vid = wait_until(lambda: _running(workers, "gpu0", "framefleet.depth"), 120, "depth under way")
        r = redis.Redis.from_url(own_redis)
        claim = claims.claim_key(str(out.resolve()), vid, "depth")
        assert r.exists(claim), r.keys("ff:claim:*")
        fill(r)
        full_at = time.monotonic()
        # Full past the lease TTL and the registry's: the claim lapsed, the worker is gone from the registry, and
        # the stage ended while Redis could not take its claim back.
        wait_until(lambda: not r.exists(claim), 30, "the depth claim to lapse")
        wait_until(lambda: workers.state("gpu0") is None, 30, "gpu0's registry entry to lapse")
        wait_until(lambda: f"depth of {vid} failed for good" in workers.log("gpu0"), 60, "depth to end while full")
        r.config_set("maxmemory", "0")  # room again
        r.delete("ballast")
        back_at = time.monotonic()
        output, _ = following.communicate(timeout=120)
        ended_s = time.monotonic() - back_at
        assert following.returncode == 1, output[-3000:]  # a video failed
        assert "Redis is full" in output and "enqueue again with --continue" in output, output[-3000:]
        summary = json.loads((out / "run_summary.json").read_text())
        assert summary["done"] == 1 and [f["video_id"] for f in summary["failed"]] == [vid], summary
        failure = summary["failed"][0]
        assert failure["stage"] == "depth" and failure["error_class"] == "RedisUnavailable", failure
        assert "Redis is full" in failure["reason"] and "CONFIG SET maxmemory" in failure["reason"], failure
        assert failure["reason"].endswith("enqueue again with --continue once Redis takes writes"), failure
        assert [p.poll() for p in workers.procs.values()] == [None, None]  # both rode it out
        log = workers.log("gpu0")
        assert "Traceback" not in log and "GpuOutOfMemory" not in log, log[-5000:]
        assert "publishing the worker state failed" in log and "Redis is full" in log
        assert_nothing_lost(out)  # the failed video is quarantined, not gone

        done = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--continue", env=env, timeout_s=120)
        assert done.returncode == 0, done.stdout + done.stderr
        summary = json.loads((out / "run_summary.json").read_text())
        assert summary["done"] == 1 and summary["already_complete"] == 1 and summary["failed"] == [], summary
        assert_nothing_lost(out)
        assert twice(workers.logs) == {} and len(stage_runs(workers.logs)) == 2 * 5, stage_runs(workers.logs)
        record(
            "Redis full while a stage runs",
            f"maxmemory below use for {back_at - full_at:.1f} s (lease TTL 2 s), then room",
            out,
            None,
            ended_s,
            workers.logs,
        )
    finally:
        if following is not None:
            following.kill()
        workers.stop_all()

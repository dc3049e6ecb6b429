"""`framefleet run` when one of its workers dies before it is ready: restarted as any other, and the run ends 0."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.faults.conftest import env_for

pytestmark = pytest.mark.timeout(900)


def _starting_worker(parent: int) -> psutil.Process | None:
    """A worker process the run started (``celery ... worker``), or None while there is none yet."""
    try:
        children = psutil.Process(parent).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if "celery" in argv and "worker" in argv:
            return child
    return None


def test_a_worker_killed_while_starting_is_restarted_and_the_run_finishes(video_factory, redis_server, tmp_path):
    out = tmp_path / "out"
    run = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.main", "run", str(video_factory(1)), "--out", str(out)],
        cwd=ROOT,
        env=env_for(redis_server.url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        victim = wait_until(lambda: _starting_worker(run.pid), 120, "the run's first worker process")
        argv = victim.cmdline()
        name = argv[argv.index("-n") + 1].split("@")[0]
        registered = redis.Redis.from_url(redis_server.url).keys(f"ff:worker:{name}@*")
        victim.kill()  # before it has loaded its models and registered
        stdout, stderr = run.communicate(timeout=800)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert registered == [], "the worker registered before it was killed: not a kill while starting"
    assert run.returncode == 0, stdout[-2000:] + stderr[-3000:]
    assert f"worker {name}: exited: exited with status -9" in stderr, stderr[-3000:]
    assert f"worker {name}: restarted" in stderr, stderr[-3000:]

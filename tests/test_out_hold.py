"""One live run per output folder: a second run refused by name, two at once give one, a killed enqueuer's hold
taken over."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from tasks.run import hold, runs
from tests.conftest import ROOT, settings_env
from tests.test_runs import SLOW_DEPTH, ff, run_id_of

pytestmark = pytest.mark.timeout(300)


def test_a_second_run_on_a_live_out_is_refused_naming_the_run_and_its_commands(
    video_factory, workers, pipeline_env, tmp_path
):
    raw, other = video_factory(2), video_factory(1)
    env = settings_env(tmp_path, SLOW_DEPTH)
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env)
    out = tmp_path / "out"
    first = ff("enqueue", str(raw), "--out", str(out), "--no-wait", env=pipeline_env)
    assert first.returncode == 0, first.stderr
    live = run_id_of(out)

    for args in (["--continue"], ["--force"]):
        again = ff("enqueue", str(raw), "--out", str(out), *args, "--no-wait", env=pipeline_env)
        assert again.returncode == 2, again.stdout + again.stderr
        assert f"is held by run {live}" in again.stderr and "its workers are running it" in again.stderr
        assert f"framefleet status --watch {live}" in again.stderr and f"framefleet cancel {live}" in again.stderr
        assert f"REDIS_URL={pipeline_env['REDIS_URL']}" in again.stderr  # the commands name the run's Redis
        assert "celery -A tasks worker -Q cpu" in again.stderr  # the worker command that joins it
        assert "Traceback" not in again.stderr
    added = ff("enqueue", str(other), "--out", str(out), "--continue", "--add", "--no-wait", env=pipeline_env)
    assert added.returncode == 2 and f"is held by run {live}" in added.stderr, added.stderr
    # `framefleet run` is refused before it starts a worker: its log folder stays as it was.
    started = ff("run", str(raw), "--out", str(out), "--continue", env=pipeline_env, timeout_s=60)
    assert started.returncode == 2 and f"is held by run {live}" in started.stderr, started.stderr
    assert not (out / "logs").exists()
    assert [p.stem for p in (out / "runs").glob("*.json")] == [live]  # no second run was recorded

    cancelled = ff("cancel", "--out", str(out), env=pipeline_env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert not hold.file_path(out).exists()
    resumed = ff("enqueue", str(raw), "--out", str(out), "--continue", "--no-wait", env=pipeline_env)
    assert resumed.returncode == 0, resumed.stderr
    assert run_id_of(out) != live and hold.read_file(out)["run_id"] == run_id_of(out)


def test_two_enqueues_at_the_same_instant_give_one_run(redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    out = tmp_path / "out"
    start, won, refused = threading.Barrier(8), [], []

    def enqueue(n: int) -> None:
        start.wait()
        try:
            won.append(hold.acquire(r, out, f"run-{n}", redis_url, 600, lambda stale: None))
        except hold.OutHeld as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(won) == 1 and len(refused) == 7, (won, refused)
    assert all(f"is held by run {won[0].value['run_id']}" in text for text in refused)
    won[0].release()


def test_two_enqueue_commands_started_together_on_a_fresh_out(video_factory, pipeline_env, tmp_path):
    raw, out = video_factory(2), tmp_path / "out"
    argv = [sys.executable, "-m", "tasks.cli.main", "enqueue", str(raw), "--out", str(out), "--no-wait"]
    procs = [subprocess.Popen(argv, cwd=ROOT, env=pipeline_env, text=True, stderr=subprocess.PIPE) for _ in range(2)]
    ends = [(p.wait(timeout=120), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    assert sorted(code for code, _ in ends) == [0, 2], ends
    assert len(list((out / "runs").glob("*.json"))) == 1
    assert any(f"is held by run {run_id_of(out)}" in text for code, text in ends if code == 2), ends


# An enqueue as a user starts it, killed with SIGKILL once it has sent its first video and before it has sent all.
KILLED_WHILE_SENDING = """
import os, signal, sys
from tasks.run.send import RunSender
real = RunSender.add
def add(self, entry):
    real(self, entry)
    if self.count >= 1:
        os.kill(os.getpid(), signal.SIGKILL)
RunSender.add = add
from tasks.cli.main import main
sys.exit(main())
"""


def test_the_hold_of_an_enqueuer_killed_while_sending_is_taken_over_and_its_run_ended(
    video_factory, pipeline_env, tmp_path
):
    raw, out = video_factory(2), tmp_path / "out"
    argv = ["enqueue", str(raw), "--out", str(out), "--no-wait", "--window", "1"]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_SENDING, *argv],
        cwd=ROOT,
        env=pipeline_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    dead = hold.read_file(out)
    assert dead is not None and dead["phase"] == "sending"
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)
    # Its process is gone from this host: the hold is stale at once, its beat still alive.
    assert r.exists(hold.beat_key(dead["run_id"]))
    taken = ff("enqueue", str(raw), "--out", str(out), "--continue", "--no-wait", env=pipeline_env)
    assert taken.returncode == 0, taken.stderr
    assert f"run {dead['run_id']} cancelled: its enqueuer (pid {dead['pid']}" in taken.stderr, taken.stderr
    ended = runs.read(out, dead["run_id"])
    assert ended is not None and ended["status"] == "cancelled" and "stopped while sending" in ended["cancel_note"]
    assert json.loads(r.hget(runs.redis_key(dead["run_id"]), "record"))["status"] == "cancelled"
    assert r.exists(f"ff:cancelled:{dead['run_id']}")  # what it sent stops at the flag
    now = hold.read_file(out)
    # The new run's id from its own first line ("run <id>: …"): two runs started in one second do not sort by time.
    taken_id = taken.stdout.split(":", 1)[0].removeprefix("run ").strip()
    assert now is not None and now["run_id"] == taken_id != dead["run_id"], (now, taken.stdout[:200])
    assert json.loads(r.get(hold.lock_key(out)))["run_id"] == now["run_id"]


def test_a_hold_whose_beat_lapsed_is_stale_and_one_beating_is_live(redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    # An enqueuer on another host (its process cannot be looked at from here): only its beat tells.
    elsewhere = {"run_id": "20260101-000000-abcd", "phase": "sending", "host": "another-host", "pid": 1}
    r.set(hold.beat_key(elsewhere["run_id"]), "1", ex=hold.BEAT_TTL_S)
    assert hold.why_live(r, elsewhere) == "its enqueuer is sending it"
    r.delete(hold.beat_key(elsewhere["run_id"]))  # its beat lapsed
    assert hold.why_live(r, elsewhere) is None


def test_a_hold_on_a_redis_that_is_gone_is_stale(redis_url, tmp_path):
    out = tmp_path / "out"
    (out / runs.FOLDER).mkdir(parents=True)
    # A `framefleet run` whose private Redis ended with it: its record says running, its Redis refuses connections.
    gone = {"run_id": "20260101-000000-abcd", "phase": "running", "redis": "redis://127.0.0.1:1/0", "pid": 1}
    hold.file_path(out).write_text(json.dumps(gone))
    runs.write(out, {"run_id": gone["run_id"], "status": "running"})
    assert hold.held_elsewhere(out, redis_url) is None
    # The same hold on a Redis that answers and knows the run as running: refused.
    live = {**gone, "redis": redis_url}
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    runs.publish(r, {"run_id": gone["run_id"], "status": "running", "started": 0}, 60)
    hold.file_path(out).write_text(json.dumps(live))
    found = hold.held_elsewhere(out, None)
    assert found is not None and found[0]["run_id"] == gone["run_id"]
    assert Path(hold.file_path(out)).exists()


def test_a_run_on_another_redis_sees_the_live_run_in_out_and_is_refused(video_factory, pipeline_env, tmp_path):
    from tests.conftest import start_redis_server

    raw, out = video_factory(1), tmp_path / "out"
    first = ff("enqueue", str(raw), "--out", str(out), "--no-wait", env=pipeline_env)  # no worker: it stays live
    assert first.returncode == 0, first.stderr
    live = run_id_of(out)
    other_url, stop = start_redis_server()
    try:
        other = {**pipeline_env, "REDIS_URL": other_url}
        refused = ff("enqueue", str(raw), "--out", str(out), "--continue", "--no-wait", env=other)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"is held by run {live}" in refused.stderr and f"Redis {pipeline_env['REDIS_URL']}" in refused.stderr
        assert f"REDIS_URL={pipeline_env['REDIS_URL']} framefleet cancel {live}" in refused.stderr
        assert ff("cancel", live, env=pipeline_env).returncode == 0  # on its own Redis
        taken = ff("enqueue", str(raw), "--out", str(out), "--continue", "--no-wait", env=other)
        assert taken.returncode == 0, taken.stderr
        assert hold.read_file(out)["redis"] == other_url
    finally:
        stop()

"""A cancel every view agrees on: the run's record in Redis and in OUT, `status RUN`, `status --out`, and Flower's
task and worker APIs over HTTP (the running task cancelled, the waiting ones revoked, no pseudo-worker)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import redis

from tasks.delivery import queues
from tests.conftest import process_env, settings_env, wait_until
from tests.test_flower_monitoring import Flower
from tests.test_runs import SLOW_DEPTH, ff, run_id_of

pytestmark = pytest.mark.timeout(400)


def test_a_cancelled_run_is_cancelled_in_redis_status_out_and_flower(video_factory, workers, pipeline_env, tmp_path):
    flower_env = {k: v for k, v in pipeline_env.items() if not k.startswith("FLOWER_")}
    flower = Flower(flower_env, tmp_path / "flower.log", f"ops:{secrets.token_urlsafe(12)}", "--address=127.0.0.1")
    try:
        flower.wait_ready()
        env = settings_env(tmp_path, SLOW_DEPTH)
        workers.start("cpu", env=env)
        workers.start("gpu0", env=env)
        out = tmp_path / "out"
        sent = ff("enqueue", str(video_factory(3)), "--out", str(out), "--no-wait", env=pipeline_env)
        assert sent.returncode == 0, sent.stderr
        run_id = run_id_of(out)
        broker = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)

        def depth_midway_and_one_waiting() -> bool:
            state = workers.state("gpu0") or {}
            frames = state.get("frames") or [0, 0]
            running = (state.get("current") or {}).get("task") == "framefleet.depth" and 0 < frames[0] < frames[1]
            return running and queues.lengths(broker, ["gpu0"])["gpu0"] > 0

        wait_until(depth_midway_and_one_waiting, 240, "a depth midway on gpu0 and another waiting for it")
        running = workers.state("gpu0")["current"]["task_id"]
        cancelled = ff("cancel", run_id, env=pipeline_env)
        assert cancelled.returncode == 0, cancelled.stderr
        wait_until(lambda: not (workers.state("gpu0") or {}).get("busy"), 240, "the running depth to stop")

        assert json.loads((out / "runs" / f"{run_id}.json").read_text())["status"] == "cancelled"
        assert json.loads(broker.hget(f"ff:run:{run_id}", "record"))["status"] == "cancelled"
        for args in ([run_id], ["--out", str(out)]):
            shown = ff("status", *args, env=pipeline_env)
            assert shown.returncode == 0, shown.stderr
            line = next(x for x in shown.stdout.splitlines() if x.startswith(f"run {run_id} "))
            assert line.endswith(", cancelled"), shown.stdout
        stored = json.loads(broker.get(f"celery-task-meta-{running}"))
        assert stored["status"] == "REVOKED", stored

        def flower_settled() -> dict | None:
            tasks = flower.json("/api/tasks")
            states = {t["uuid"]: t["state"] for t in tasks.values()}
            return tasks if states.get(running) == "CANCELLED" and "REVOKED" in states.values() else None

        tasks = wait_until(flower_settled, 30, "Flower to show the running task cancelled and a waiting one revoked")
        assert {t["state"] for t in tasks.values()} <= {"SUCCESS", "REVOKED", "CANCELLED"}, tasks
        info = flower.json(f"/api/task/info/{running}")
        assert info["state"] == "CANCELLED" and info["worker"] == "gpu0@test", info
        page = flower.json("/workers?json=1")["data"]
        assert sorted(w["hostname"] for w in page) == ["cpu@test", "gpu0@test"], page
        assert not any(name.startswith("framefleet-cancel@") for name in flower.json("/api/workers"))
    finally:
        flower.stop()


def test_status_of_a_run_cancelled_before_its_record_was_updated_says_cancelled(redis_url, tmp_path):
    """A record in Redis that still says running (an earlier version's cancel): the flag decides."""
    from tasks.run import runs

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    out = Path(tmp_path / "out")
    record = {"run_id": "20260101-000000-abcd", "status": "running", "started": 1.0, "videos": 2}
    record["output_root"] = str(out)
    runs.publish(r, record, 600)
    r.set(f"ff:cancelled:{record['run_id']}", "1")
    shown = ff("status", record["run_id"], env=process_env(redis_url))
    assert shown.returncode == 0, shown.stderr
    assert f"run {record['run_id']} (in {out}), 2 videos, started" in shown.stdout
    assert ", cancelled\n" in shown.stdout and "running" not in shown.stdout.split("STAGE")[0], shown.stdout

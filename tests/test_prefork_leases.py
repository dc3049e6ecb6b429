"""A prefork CPU worker (``-c N``) lets go of a finished task's message: its lease, its owner record and its
``unacked`` entry. The parent process receives and acknowledges the messages while the task runs in a child,
where ``task_postrun`` fires; the parent must forget the message itself, or its heartbeat keeps renewing the
lease and puts the acknowledged entry back, and a reaper later redelivers every task the worker ever ran."""

from __future__ import annotations

import json

import pytest
import redis

from tests.conftest import run_script, wait_until

pytestmark = pytest.mark.timeout(300)


def test_a_prefork_cpu_worker_leaves_no_lease_nor_unacked_entry_of_a_finished_task(
    video_factory, workers, pipeline_env, tmp_path
):
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)
    workers.start("cpu", pool="prefork", concurrency=2)
    workers.start("gpu0")
    out = tmp_path / "out"
    done = run_script("enqueue_dataset.py", str(video_factory(3)), "--out", str(out), env=pipeline_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((out / "run_summary.json").read_text())["done"] == 3

    def cpu_worker() -> dict:
        return next(w for w in map(json.loads, (r.get(k) for k in r.scan_iter("ff:worker:cpu*"))) if w)

    wait_until(lambda: not r.hlen("unacked") and not cpu_worker()["leases"], 60, "every message let go")
    # Three more heartbeats of the CPU worker (each renews its leases, then publishes its state): nothing is put back.
    beats = {cpu_worker()["updated"]}

    def three_more() -> bool:
        beats.add(cpu_worker()["updated"])
        return len(beats) > 3

    wait_until(three_more, 60, "three more heartbeats of the CPU worker")
    restored = r.hkeys("unacked")
    assert restored == [], f"acknowledged messages put back in unacked: {restored}"
    assert list(r.scan_iter("ff:lease:*")) == [] and list(r.scan_iter("ff:lease-owner:*")) == []
    assert cpu_worker()["leases"] == []

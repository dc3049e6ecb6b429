"""Later stages first: priorities on real Redis queues, real Celery messages and real workers."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from tasks.delivery import claims, queues
from tasks.pipeline import STAGE_TASKS
from tasks.workers import registry
from tests.conftest import wait_until

CHAIN = ["preprocess", "depth", "tracks", "hands", "h5"]


def job(video_id: str, tmp_path, **extra):
    return {
        "run_id": "run-1",
        "video_id": video_id,
        "video": f"{video_id}.mp4",
        "output_root": str(tmp_path / "out"),
        "dataset_root": str(tmp_path / "raw"),
        "chain": CHAIN,
        "gpus": None,
        "gpu": None,
        **extra,
    }


def test_priority_follows_the_place_in_the_chain_not_stage_names():
    assert [queues.stage_priority(s, CHAIN) for s in CHAIN] == [4, 3, 2, 1, 0]
    # A chain without hands: tracks is then the last model stage, one before h5.
    assert queues.stage_priority("tracks", ["preprocess", "depth", "tracks", "h5"]) == 1
    assert queues.logical_name(queues.key_for("gpu0.depth", 3)) == "gpu0.depth"
    assert queues.key_for("gpu0", 0) == "gpu0"


@pytest.mark.parametrize(
    ("queue", "early", "late"),
    [("gpu0", "depth", "tracks"), ("cpu", "preprocess", "h5")],
)
def test_a_worker_with_an_earlier_and_a_later_stage_waiting_takes_the_later_first(
    app_on_test_redis, workers, tmp_path, queue, early, late
):
    """Jobs already failed pass through their stages at once: the order is the worker's choice alone."""
    _, r = app_on_test_redis
    failed = {"stage": "preprocess", "error_class": "test", "reason": "test", "attempts": 1, "worker": "w", "time": 0.0}
    # Results are kept for this test (stages before the last store none by default), to order them by their end.
    sent = [
        STAGE_TASKS[early].apply_async(
            args=(job(f"early{i}", tmp_path, failed=failed),), queue=queue, ignore_result=False
        )
        for i in range(3)
    ]
    sent.insert(
        1, STAGE_TASKS[late].apply_async(args=(job("late", tmp_path, failed=failed),), queue=queue, ignore_result=False)
    )
    assert queues.length(r, queue) == 4 and r.llen(queue) < 4  # in more than one of the queue's lists

    workers.start(queue)

    def ended(task_id: str) -> bool:  # a stored result is STARTED first (task_track_started), then its end
        raw = r.get(f"celery-task-meta-{task_id}")
        return raw is not None and json.loads(raw)["status"] not in ("PENDING", "STARTED")

    wait_until(lambda: all(ended(t.id) for t in sent), 60, "the four tasks to finish")
    done_at = {}
    for t in sent:
        meta = json.loads(r.get(f"celery-task-meta-{t.id}"))
        assert meta["status"] == "SUCCESS", meta
        done_at[meta["result"]["video_id"]] = datetime.fromisoformat(meta["date_done"])
    order = sorted(done_at, key=done_at.__getitem__)
    assert order[0] == "late", order
    assert order[1:] == ["early0", "early1", "early2"]  # one priority: first in, first out


def test_every_reader_of_a_queue_length_counts_all_its_priority_lists(app_on_test_redis, tmp_path):
    conf, r = app_on_test_redis
    from tasks.cli.status import queue_rows
    from tasks.gpu import NoGpuProbe
    from tasks.observe import stall
    from tasks.observe.metrics import FramefleetCollector
    from tasks.run import cancel

    # Three messages in gpu0's lists for priorities 1, 2 and 3, none in the list named gpu0 itself.
    for stage in ("depth", "tracks", "hands"):
        STAGE_TASKS[stage].apply_async(args=(job(stage, tmp_path),), queue="gpu0")
    assert not r.exists("gpu0") and len(r.keys("gpu0*")) == 3
    assert queues.length(r, "gpu0") == 3
    assert queues.lengths(r, ["gpu0", "cpu"]) == {"gpu0": 3, "cpu": 0}

    assert stall.queue_names(r, r, conf) == ["cpu", "gpu0"]
    assert stall.run_messages(r, r, conf, "run-1", "no-callback") == 3
    assert any(line.startswith("queue gpu0: 3 tasks waiting and no live worker") for line in stall.diagnose(r, r, conf))

    registry.publish(
        r,
        {"hostname": "gpu0@a", "gpu": 0, "gpu_queues": ["gpu0"], "queues": ["gpu0"], "stages": ["depth", "tracks"]},
        ttl_s=30,
    )
    assert [q.waiting for q in registry.queue_loads(r, "depth")] == [3]
    assert ["gpu0", 3] in queue_rows(conf, [])
    depth = next(
        m for m in FramefleetCollector(conf, NoGpuProbe("none")).collect() if m.name == "framefleet_queue_depth"
    )
    assert {s.labels["queue"]: s.value for s in depth.samples}["gpu0"] == 3

    removed = cancel.remove_waiting(r, stall.queue_names(r, r, conf), "run-1")
    assert len(removed) == 3 and queues.length(r, "gpu0") == 0


def test_a_gpu_queue_no_worker_consumed_is_found_without_a_scan_of_every_key(app_on_test_redis, tmp_path):
    """Routing queues a task on a GPU no worker ever consumed when none hosts its stage; the stall report, the
    sweep and cancel still find it, with LLENs of the queues it may be, not a scan of a live run's every key."""
    conf, r = app_on_test_redis
    from tasks.observe import stall

    STAGE_TASKS["depth"].apply_async(args=(job("depth", tmp_path),), queue="gpu3")
    for n in range(2000):
        r.sadd(f"ff:run:run-1:done:{n:x}", n)  # a live run's other keys
    r.config_resetstat()
    assert stall.queue_names(r, r, conf) == ["cpu", "gpu3"]
    assert any(line.startswith("queue gpu3: 1 tasks waiting and no live worker") for line in stall.diagnose(r, r, conf))
    assert stall.run_messages(r, r, conf, "run-1", "no-callback") == 1
    stats = r.info("commandstats")
    assert "cmdstat_scan" not in stats and "cmdstat_keys" not in stats, sorted(stats)


def test_the_rebalancer_moves_a_message_into_the_same_priority_list(app_on_test_redis, tmp_path):
    conf, r = app_on_test_redis
    from tasks.delivery.rebalance import rebalance

    STAGE_TASKS["depth"].apply_async(args=(job("a", tmp_path),), queue="gpu1")
    STAGE_TASKS["tracks"].apply_async(args=(job("b", tmp_path),), queue="gpu1")
    r.sadd(registry.GPU_QUEUES_KEY, "gpu1")  # gpu1 had a worker once; now only gpu0 has one
    registry.publish(
        r,
        {"hostname": "gpu0@a", "gpu": 0, "gpu_queues": ["gpu0"], "queues": ["gpu0"], "stages": ["depth", "tracks"]},
        ttl_s=30,
    )
    assert rebalance(r, conf) == 2
    moved = {queues.message_priority(raw): key for key, raw in queues.waiting(r, "gpu0")}
    assert moved == {3: queues.key_for("gpu0", 3), 2: queues.key_for("gpu0", 2)}
    assert queues.length(r, "gpu1") == 0


def test_a_retry_keeps_its_priority(app_on_test_redis, workers, tmp_path):
    """A depth task finds its claim held by another run, so it retries; the retry waits on gpu1 (no worker there)."""
    conf, r = app_on_test_redis
    retried = job("v", tmp_path, gpus=[1])
    key = claims.claim_key(retried["output_root"], "v", "depth")
    r.set(key, "elsewhere@host another-task", ex=120)
    workers.start("gpu0")
    sent = STAGE_TASKS["depth"].apply_async(args=(retried,), queue="gpu0")
    priority = queues.stage_priority("depth", CHAIN)
    assert priority > 0

    wait_until(lambda: queues.length(r, "gpu1"), 60, "the retry to be sent to gpu1")
    [(where, raw)] = queues.waiting(r, "gpu1")
    message = json.loads(raw)
    assert message["headers"]["id"] == sent.id and message["headers"]["retries"] == 1
    assert where == queues.key_for("gpu1", priority) and queues.message_priority(raw) == priority


def test_stage_priorities_off_routes_without_a_priority(app_on_test_redis, monkeypatch, tmp_path):
    from tasks import configure
    from tasks.delivery.routing import route_task
    from worker_config.settings import load_settings

    assert route_task("framefleet.h5", (job("v", tmp_path),), {}, {}) == {"queue": "cpu", "priority": 0}
    monkeypatch.setenv("FRAMEFLEET_STAGE_PRIORITIES", "false")
    configure(load_settings())
    try:
        assert route_task("framefleet.preprocess", (job("v", tmp_path),), {}, {}) == {"queue": "cpu"}
    finally:
        monkeypatch.delenv("FRAMEFLEET_STAGE_PRIORITIES")
        configure(load_settings())

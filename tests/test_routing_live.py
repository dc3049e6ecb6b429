"""Send-time routing and the rebalancer on a real Redis with real Celery messages."""

from __future__ import annotations

import hashlib
import time

import pytest
import redis

from tasks import keys
from tasks.delivery import queues, routing
from tasks.delivery.rebalance import rebalance
from tasks.delivery.routing import forget_registry, handoff_queue, refresh_registry, route_task
from tasks.job import Job
from tasks.pipeline import STAGE_TASKS
from tasks.workers import registry
from tests.conftest import TEST_DB, send_task, wait_until
from worker_config.settings_match import settings_queue


@pytest.fixture(autouse=True)
def fresh_registry_reads():
    """Each test registers its own workers: the router must not reuse another test's registry read."""
    forget_registry()
    yield
    forget_registry()


# Settings hashes as enqueue makes them (sha256 hex): a settings queue names the first characters.
SHA = {name: hashlib.sha256(name.encode()).hexdigest() for name in ("aaa", "bbb", "ccc", "a1", "b2", "abc")}


def register(r, name: str, gpu: int, busy: bool = False, **state) -> None:
    registry.publish(
        r,
        {
            "hostname": name,
            "gpu": gpu,
            "gpu_queues": [f"gpu{gpu}"],
            "queues": [f"gpu{gpu}"],
            "stages": ["depth", "tracks", "hands"],
            "busy": busy,
            "updated": time.time(),
            **state,
        },
        ttl_s=30,
    )


def job(**extra):
    return {"run_id": "r", "video_id": "v", "video": "v.mp4", "gpus": None, "gpu": None, **extra}


def _ids(r, queue: str) -> list[str]:
    """The video ids of the tasks waiting in ``queue``, oldest first (the order its worker takes them)."""
    from tasks.delivery.rebalance import _decode

    return [_decode(raw)[1].video_id for _, raw in reversed(queues.waiting(r, queue))]


def test_router_sends_gpu_stages_to_the_least_loaded_live_queue(app_on_test_redis):
    _, r = app_on_test_redis
    register(r, "gpu0@a", 0, busy=True)
    register(r, "gpu1@a", 1)
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu1"
    r.lpush("gpu1", "x", "y")  # two waiting on gpu1 outweigh one busy worker on gpu0
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu0"
    assert route_task("framefleet.tracks", (job(gpus=[1]),), {}, {})["queue"] == "gpu1"
    assert route_task("framefleet.h5", (job(),), {}, {})["queue"] == "cpu"
    assert route_task("framefleet.hands", (job(failed={"stage": "depth"}),), {}, {})["queue"] == "cpu"


def test_router_sees_a_worker_that_registers_after_its_last_registry_read(app_on_test_redis):
    _, r = app_on_test_redis
    register(r, "gpu0@a", 0, busy=True)
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu0"
    register(r, "gpu1@a", 1)  # idle: the better choice once the router has read the registry again
    wait_until(lambda: route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu1", 10, "routing to gpu1")


def test_rebalancer_moves_waiting_tasks_off_a_queue_without_live_worker(app_on_test_redis):
    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]

    register(r, "gpu1@a", 1)
    depth.apply_async(args=(job(video_id="a"),), queue="gpu1")
    depth.apply_async(args=(job(video_id="c", gpus=[1]),), queue="gpu1")
    depth.apply_async(args=(job(video_id="b"),), queue="gpu1")
    registry.remove(r, "gpu1@a")  # gpu1's worker is gone; gpu0's arrives
    register(r, "gpu0@a", 0)
    assert queues.length(r, "gpu1") == 3
    assert rebalance(r, conf) == 2
    # The task restricted to GPU 1 stays where it may run; the others wait on gpu0, oldest first.
    assert queues.length(r, "gpu1") == 1 and queues.length(r, "gpu0") == 2
    r.delete("ff:rebalance-lock")
    assert rebalance(r, conf) == 0
    from tasks.delivery.rebalance import _decode

    assert [_decode(raw)[1].video_id for raw in reversed([raw for _, raw in queues.waiting(r, "gpu0")])] == [
        "a",
        "b",
    ]


def test_rebalancer_drains_a_gpu_queue_no_worker_ever_registered_as_the_stall_report_sees_it(app_on_test_redis):
    from tasks.observe.stall import diagnose

    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]
    depth.apply_async(args=(job(video_id="a"),), queue="gpu0")  # routed where no worker ever consumed
    depth.apply_async(args=(job(video_id="b", gpus=[0]),), queue="gpu0")
    register(r, "gpu1@a", 1)
    assert "gpu0" not in registry.known_gpu_queues(r)
    assert [line for line in diagnose(r, r, conf) if line.startswith("queue gpu0: 2 tasks waiting")]
    assert rebalance(r, conf) == 1
    # The task that may run only on GPU 0 stays, still reported; the other waits on the live gpu1.
    assert queues.length(r, "gpu0") == 1 and queues.length(r, "gpu1") == 1
    assert [line for line in diagnose(r, r, conf) if line.startswith("queue gpu0: 1 tasks waiting")]


def test_rebalancer_evens_out_live_queues_respecting_gpu_restrictions(app_on_test_redis):
    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]
    from tasks.delivery.rebalance import _decode

    register(r, "gpu0@a", 0)
    register(r, "gpu1@a", 1)
    for i in range(6):  # sent while only gpu0 was known
        depth.apply_async(args=(job(video_id=f"v{i}", gpus=[0] if i == 0 else None),), queue="gpu0")
    assert rebalance(r, conf) == 3
    assert queues.length(r, "gpu0") == 3 and queues.length(r, "gpu1") == 3
    assert "v0" in [_decode(raw)[1].video_id for _, raw in queues.waiting(r, "gpu0")]  # may only run on GPU 0
    # the oldest waiting tasks moved, so they start first on the idle GPU
    assert sorted(_decode(raw)[1].video_id for _, raw in queues.waiting(r, "gpu1")) == ["v1", "v2", "v3"]
    r.delete("ff:rebalance-lock")
    assert rebalance(r, conf) == 0  # balanced: nothing moves back and forth


def test_live_queues_are_evened_out_per_worker_counting_the_tasks_running(app_on_test_redis):
    """gpu0's two workers, one running a task, have four waiting; gpu1's three are idle: three move, and each
    worker then has one task, running or waiting."""
    conf, r = app_on_test_redis
    register(r, "gpu0@a", 0, busy=True)
    register(r, "gpu0@b", 0)
    for name in ("gpu1@a", "gpu1@b", "gpu1@c"):
        register(r, name, 1)
    for i in range(4):
        STAGE_TASKS["depth"].apply_async(args=(job(video_id=f"v{i}"),), queue="gpu0")
    assert rebalance(r, conf) == 3
    assert (_ids(r, "gpu0"), _ids(r, "gpu1")) == (["v3"], ["v0", "v1", "v2"])


def test_the_rebalancer_never_moves_a_task_to_workers_with_other_settings_than_its_runs(app_on_test_redis):
    """Routing sends a task only where the workers run its run's settings; the rebalancer keeps to the same rule,
    both when it evens out live queues and when it empties a queue whose workers are gone."""
    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]
    from tasks.delivery.rebalance import _decode

    register(r, "gpu0@a", 0, busy=True, settings={"depth": {"sha256": SHA["aaa"]}})
    register(r, "gpu1@a", 1, settings={"depth": {"sha256": SHA["bbb"]}})
    for i in range(4):  # gpu1 is idle, but its worker would only send them on to a settings queue
        depth.apply_async(args=(job(video_id=f"a{i}", settings={"depth": SHA["aaa"]}),), queue="gpu0")
    depth.apply_async(args=(job(video_id="b0", settings={"depth": SHA["bbb"]}),), queue="gpu0")
    assert rebalance(r, conf) == 1  # b0 only: its run's settings are gpu1's
    assert [_decode(raw)[1].video_id for _, raw in queues.waiting(r, "gpu1")] == ["b0"]
    register(r, "gpu2@a", 2, settings={"depth": {"sha256": SHA["aaa"]}})
    depth.apply_async(args=(job(video_id="c0", settings={"depth": SHA["ccc"]}),), queue="gpu2")
    depth.apply_async(args=(job(video_id="b1", settings={"depth": SHA["bbb"]}),), queue="gpu2")
    depth.apply_async(args=(job(video_id="a4", settings={"depth": SHA["aaa"]}),), queue="gpu2")
    registry.remove(r, "gpu2@a")  # gpu2's worker is gone: each task goes where its settings run, if anywhere
    r.delete("ff:rebalance-lock")
    assert rebalance(r, conf) == 2
    assert sorted(_decode(raw)[1].video_id for _, raw in queues.waiting(r, "gpu1")) == ["b0", "b1"]
    assert "a4" in [_decode(raw)[1].video_id for _, raw in queues.waiting(r, "gpu0")]
    assert [_decode(raw)[1].video_id for _, raw in queues.waiting(r, "gpu2")] == ["c0"]  # no live worker has them


def test_tasks_on_a_settings_queue_no_worker_consumes_move_to_their_settings_beside_a_queue_one_does(
    app_on_test_redis,
):
    """A worker with the run's settings came up on another GPU than the one its tasks waited on: they go to it,
    but for a task restricted to the GPU it waited on, and none goes to other settings."""
    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]
    from tasks.delivery.rebalance import _decode

    lost, found = settings_queue("gpu1", "depth", SHA["aaa"]), settings_queue("gpu0", "depth", SHA["aaa"])
    stray = settings_queue("gpu1", "depth", SHA["ccc"])
    register(r, "gpu0@a", 0, settings={"depth": {"sha256": SHA["aaa"]}}, settings_queues=[found])
    r.sadd(keys.SETTINGS_QUEUES, lost, stray)  # as routing lists them when it sends there
    for vid, gpus in (("a", None), ("b", [1]), ("c", None)):
        depth.apply_async(args=(job(video_id=vid, gpus=gpus, settings={"depth": SHA["aaa"]}),), queue=lost)
    depth.apply_async(args=(job(video_id="x", settings={"depth": SHA["ccc"]}),), queue=stray)

    def ids(queue: str) -> list[str]:
        return sorted(_decode(raw)[1].video_id for _, raw in queues.waiting(r, queue))

    assert rebalance(r, conf) == 2
    assert (ids(found), ids(lost), ids(stray)) == (["a", "c"], ["b"], ["x"])
    r.delete("ff:rebalance-lock")
    assert rebalance(r, conf) == 0


def test_tasks_moved_off_a_parked_settings_queue_keep_their_order_past_those_that_stay(app_on_test_redis):
    """The oldest moves first, so it starts first where it lands; a task restricted to the GPU it waited on is
    stepped over wherever it sits, the oldest or between the others (one whose run may use both GPUs moves)."""
    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]
    lost, found = settings_queue("gpu1", "depth", SHA["aaa"]), settings_queue("gpu0", "depth", SHA["aaa"])
    register(r, "gpu0@a", 0, settings={"depth": {"sha256": SHA["aaa"]}}, settings_queues=[found])
    r.sadd(keys.SETTINGS_QUEUES, lost)
    for vid, gpus in (("s0", [1]), ("a", None), ("s1", [1]), ("b", [0, 1]), ("c", None)):
        depth.apply_async(args=(job(video_id=vid, gpus=gpus, settings={"depth": SHA["aaa"]}),), queue=lost)
    assert rebalance(r, conf) == 3
    assert (_ids(r, found), _ids(r, lost)) == (["a", "b", "c"], ["s0", "s1"])


def test_routing_and_the_rebalancer_read_queue_lengths_on_the_broker_when_it_is_another_redis(redis_url, monkeypatch):
    """broker_url names another database: the queues are there, the registry on redis_url."""
    broker_url = redis_url.rsplit("/", 1)[0] + f"/{TEST_DB + 1}"
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("FRAMEFLEET_BROKER_URL", broker_url)
    from tasks import configure
    from worker_config.settings import load_settings

    conf = load_settings()
    configure(conf)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    broker = redis.Redis.from_url(broker_url, decode_responses=True)
    broker.flushdb()
    try:
        register(r, "gpu0@a", 0)
        register(r, "gpu1@a", 1)
        broker.lpush("gpu1", "x", "y")  # two waiting on gpu1, in the broker's database
        assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu0"
        for i in range(4):
            send_task(broker_url, "framefleet.depth", (job(video_id=f"v{i}"),), "gpu0")
        broker.delete("gpu1")
        assert queues.length(broker, "gpu0") == 4
        assert rebalance(r, conf, broker=broker) == 2
        assert queues.length(broker, "gpu0") == 2 and queues.length(broker, "gpu1") == 2
    finally:
        broker.flushdb()
        monkeypatch.delenv("FRAMEFLEET_BROKER_URL")
        configure(load_settings())


def test_two_rebalancers_at_once_move_no_more_than_the_imbalance(app_on_test_redis, monkeypatch):
    """Each host's heartbeat rebalances: a second rebalancer that started from the same loads would move the
    same share again, and the tasks would only change sides."""
    import threading

    conf, r = app_on_test_redis
    register(r, "gpu0@a", 0)
    register(r, "gpu1@a", 1)
    for i in range(6):
        STAGE_TASKS["depth"].apply_async(args=(job(video_id=f"v{i}"),), queue="gpu0")
    here = threading.current_thread()
    read, other_done = threading.Event(), threading.Event()
    real = registry.queue_loads

    def held_after_reading(*args, **kwargs):
        loads = real(*args, **kwargs)
        if threading.current_thread() is not here and not read.is_set():
            read.set()  # the first rebalancer has read the loads it will act on: the other starts now
            other_done.wait(30)
        return loads

    monkeypatch.setattr(registry, "queue_loads", held_after_reading)
    moved = {}
    first = threading.Thread(target=lambda: moved.setdefault("first", rebalance(r, conf)))
    first.start()
    assert read.wait(30), "the first rebalancer never read the queues' loads"
    moved["other"] = rebalance(r, conf)
    other_done.set()
    first.join(30)
    assert moved == {"first": 3, "other": 0}
    assert (queues.length(r, "gpu0"), queues.length(r, "gpu1")) == (3, 3)


def test_a_rebalancer_that_stopped_holding_the_lock_holds_the_others_off_for_one_heartbeat_interval(
    app_on_test_redis,
):
    """The lock is never released, only left to expire: a heartbeat interval (at least a second) after a rebalance
    the next may run, on any host."""
    from tasks.delivery.rebalance import LOCK_KEY

    conf, r = app_on_test_redis
    conf = conf.model_copy(update={"heartbeat_interval_s": 0.5})
    register(r, "gpu0@a", 0)
    STAGE_TASKS["depth"].apply_async(args=(job(video_id="a"),), queue="gpu1")  # where no worker consumes
    assert rebalance(r, conf) == 1
    assert 0 < r.pttl(LOCK_KEY) <= 1000
    STAGE_TASKS["depth"].apply_async(args=(job(video_id="b"),), queue="gpu1")
    assert rebalance(r, conf) == 0  # within the interval
    wait_until(lambda: not r.exists(LOCK_KEY), 5, "the rebalance lock to expire")
    assert rebalance(r, conf) == 1
    assert _ids(r, "gpu0") == ["a", "b"]


def test_a_heartbeats_rebalance_moves_at_most_100_tasks_off_queues_without_workers_and_the_rest_at_the_next(
    app_on_test_redis,
):
    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]
    register(r, "gpu0@a", 0)
    for queue, n in (("gpu2", 60), ("gpu3", 41)):  # sent while their workers lived
        for i in range(n):
            depth.apply_async(args=(job(video_id=f"{queue}-{i}"),), queue=queue)
    assert rebalance(r, conf) == 100
    assert _ids(r, "gpu2") == [] and _ids(r, "gpu3") == ["gpu3-40"]
    r.delete("ff:rebalance-lock")
    assert rebalance(r, conf) == 1 and queues.length(r, "gpu0") == 101


def test_the_move_cap_counts_every_kind_of_move_of_a_pass(app_on_test_redis):
    """Off a queue without workers, off a parked settings queue, between live queues: max_moves in all per pass."""
    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]
    lost, found = settings_queue("gpu2", "depth", SHA["aaa"]), settings_queue("gpu0", "depth", SHA["aaa"])
    register(r, "gpu0@a", 0, settings={"depth": {"sha256": SHA["aaa"]}}, settings_queues=[found])
    register(r, "gpu1@a", 1, settings={"depth": {"sha256": SHA["aaa"]}})
    r.sadd(keys.SETTINGS_QUEUES, lost)
    for i in range(6):
        depth.apply_async(args=(job(video_id=f"b{i}"),), queue="gpu0")
    depth.apply_async(args=(job(video_id="d"),), queue="gpu2")  # no worker on gpu2
    for i in range(3):
        depth.apply_async(args=(job(video_id=f"p{i}", settings={"depth": SHA["aaa"]}),), queue=lost)
    passes = []
    for _ in range(4):
        r.delete("ff:rebalance-lock")
        passes.append(rebalance(r, conf, max_moves=2))
    # d and p0 first, then p1 and p2, then two of gpu0's six to gpu1 (d is there already), then balanced.
    assert passes == [2, 2, 2, 0]
    assert (_ids(r, found), _ids(r, "gpu1"), _ids(r, "gpu0")) == (
        ["p0", "p1", "p2"],
        ["d", "b0", "b1"],
        ["b2", "b3", "b4", "b5"],
    )


def test_a_message_the_rebalancer_cannot_read_stays_where_it_is_and_the_tasks_behind_it_move(app_on_test_redis):
    """Off a queue without workers and between live queues alike, in their order."""
    conf, r = app_on_test_redis
    depth = STAGE_TASKS["depth"]
    register(r, "gpu0@a", 0)
    register(r, "gpu1@a", 1)
    for queue, prefix in (("gpu2", "d"), ("gpu0", "b")):
        for i in range(2 if queue == "gpu2" else 4):
            depth.apply_async(args=(job(video_id=f"{prefix}{i}"),), queue=queue)
        [key] = {key for key, _raw in queues.waiting(r, queue)}
        r.rpush(key, "not a kombu message")  # the oldest: another program's, or damaged
    # gpu2's two to gpu1 (gpu0 holds five), then one of gpu0's: 4 waiting against 3.
    assert rebalance(r, conf) == 3
    assert _ids(r, "gpu1") == ["d0", "d1", "b0"]
    for queue, left in (("gpu2", 0), ("gpu0", 3)):
        [key] = {key for key, _raw in queues.waiting(r, queue)}
        assert r.lindex(key, -1) == "not a kombu message" and r.llen(key) == left + 1


def test_a_job_sent_as_a_keyword_is_routed_as_one_sent_positionally(app_on_test_redis):
    _, r = app_on_test_redis
    register(r, "gpu0@a", 0)
    register(r, "gpu1@a", 1)
    assert route_task("framefleet.depth", (), {"job": job(gpus=[1])}, {})["queue"] == "gpu1"
    assert route_task("framefleet.hands", (), {"job": job(failed={"stage": "depth"})}, {})["queue"] == "cpu"
    chain = ["preprocess", "depth", "h5"]
    assert route_task("framefleet.depth", (), {"job": job(chain=chain)}, {})["priority"] == 1  # h5 after it


def test_priority_comes_from_the_videos_chain_else_from_the_enabled_stages(app_on_test_redis):
    conf, r = app_on_test_redis
    register(r, "gpu0@a", 0)
    assert route_task("framefleet.depth", (job(chain=["preprocess", "depth", "h5"]),), {}, {}) == {
        "queue": "gpu0",
        "priority": 1,
    }
    enabled = queues.stage_priority("depth", conf.enabled_stages())
    assert enabled != 1 and route_task("framefleet.depth", (job(),), {}, {})["priority"] == enabled
    # Not a stage: the cpu queue, no priority; not a framefleet task: Celery's own routing.
    assert route_task("framefleet.aggregate", ({"run_id": "r"},), {}, {}) == {"queue": conf.cpu_queue}
    assert route_task("celery.chord_unlock", (), {}, {}) is None


def test_a_gpu_stage_goes_to_the_workers_with_the_runs_settings_for_it(app_on_test_redis):
    _, r = app_on_test_redis
    register(r, "gpu0@a", 0, settings={"depth": {"sha256": SHA["aaa"]}})
    register(r, "gpu1@a", 1, busy=True, settings={"depth": {"sha256": SHA["bbb"]}})
    assert route_task("framefleet.depth", (job(settings={"depth": SHA["bbb"]}),), {}, {})["queue"] == "gpu1"  # busy
    assert route_task("framefleet.depth", (job(settings={"depth": SHA["aaa"]}),), {}, {})["queue"] == "gpu0"
    # No live worker has the run's settings: the settings queue beside the least loaded host's, where it
    # waits for a worker with them (the stall report and the autoscaler read it).
    assert route_task("framefleet.depth", (job(settings={"depth": SHA["ccc"]}),), {}, {})["queue"] == settings_queue(
        "gpu0", "depth", SHA["ccc"]
    )
    assert route_task("framefleet.depth", (job(settings={"tracks": SHA["bbb"]}),), {}, {})["queue"] == "gpu0"


def test_a_video_stays_on_its_gpu_on_a_tie_and_leaves_the_one_it_ran_out_of_memory_on(app_on_test_redis):
    _, r = app_on_test_redis
    register(r, "gpu0@a", 0)
    register(r, "gpu1@a", 1)
    assert route_task("framefleet.tracks", (job(gpu=1),), {}, {})["queue"] == "gpu1"
    assert route_task("framefleet.tracks", (job(avoid_gpu=0),), {}, {})["queue"] == "gpu1"
    assert route_task("framefleet.tracks", (job(gpu=0, avoid_gpu=0),), {}, {})["queue"] == "gpu1"


def test_without_redis_a_gpu_stage_waits_on_its_last_gpu_or_the_first_it_may_use(monkeypatch):
    """No load readings (Redis away): the video's previous GPU, else the lowest it may use, else GPU 0."""
    from tasks import configure
    from worker_config.settings import load_settings

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    configure(load_settings())
    try:
        assert route_task("framefleet.depth", (job(gpu=3, gpus=[2, 3]),), {}, {})["queue"] == "gpu3"
        assert route_task("framefleet.depth", (job(gpus=[2, 3]),), {}, {})["queue"] == "gpu2"
        assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu0"
        # Nor can it look for a settings queue: the queue itself, and a worker's hand-off still names one.
        assert route_task("framefleet.h5", (job(settings={"h5": SHA["abc"]}),), {}, {})["queue"] == "cpu"
        assert handoff_queue("depth", Job("r", "v", gpu=3, settings={"depth": SHA["abc"]})) == settings_queue(
            "gpu3", "depth", SHA["abc"]
        )
    finally:
        monkeypatch.undo()
        configure(load_settings())


def test_routing_counts_the_waiting_tasks_on_the_broker_not_on_the_registrys_redis(redis_url, monkeypatch):
    """broker_url names another database; decoys on the registry's database must not count."""
    broker_url = redis_url.rsplit("/", 1)[0] + f"/{TEST_DB + 1}"
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("FRAMEFLEET_BROKER_URL", broker_url)
    from tasks import configure
    from worker_config.settings import load_settings

    configure(load_settings())
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    broker = redis.Redis.from_url(broker_url, decode_responses=True)
    broker.flushdb()
    try:
        register(r, "gpu0@a", 0)
        register(r, "gpu1@a", 1)
        broker.lpush("gpu0", "x", "y")  # two waiting on gpu0, in the broker's database
        r.lpush("gpu1", "decoy", "decoy", "decoy")  # a list of that name in the registry's database
        assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu1"
    finally:
        broker.flushdb()
        monkeypatch.undo()
        configure(load_settings())


def test_the_router_uses_the_heartbeats_read_of_the_registry_while_it_is_fresh(app_on_test_redis):
    """A worker's heartbeat reads the registry for the router (refresh_registry): no read of its own per send."""
    conf, r = app_on_test_redis
    register(r, "gpu0@a", 0, busy=True)
    refresh_registry(r, conf.redis_url, 600)
    register(r, "gpu1@a", 1)  # idle, but registered after the heartbeat's read
    register(r, "cpu@a", None, queues=[conf.cpu_queue], gpu_queues=[], stages=["h5"], settings={})
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu0"
    # The settings-queue check reads the same: no cpu worker (without the run's settings) in it yet.
    assert route_task("framefleet.h5", (job(settings={"h5": SHA["abc"]}),), {}, {})["queue"] == conf.cpu_queue
    forget_registry()
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu1"
    assert route_task("framefleet.h5", (job(settings={"h5": SHA["abc"]}),), {}, {})["queue"] == settings_queue(
        conf.cpu_queue, "h5", SHA["abc"]
    )


def test_the_router_reuses_its_own_read_of_the_registry_for_registry_reuse_s(app_on_test_redis, monkeypatch):
    _, r = app_on_test_redis
    monkeypatch.setattr(routing, "REGISTRY_REUSE_S", 600.0)
    register(r, "gpu0@a", 0, busy=True)
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu0"  # reads the registry
    register(r, "gpu1@a", 1)
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu0"  # the same read
    forget_registry()
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu1"


def test_a_stage_whose_queue_has_workers_without_the_runs_settings_goes_to_its_settings_queue(app_on_test_redis):
    """Beside the queue routing picks, listed in ff:settings-queues for the stall report, sweep and autoscaler."""
    conf, r = app_on_test_redis
    register(
        r, "cpu@a", None, queues=[conf.cpu_queue], gpu_queues=[], stages=["h5"], settings={"h5": {"sha256": SHA["a1"]}}
    )
    assert route_task("framefleet.h5", (job(settings={"h5": SHA["a1"]}),), {}, {})["queue"] == conf.cpu_queue
    assert route_task("framefleet.h5", (job(settings={"h5": SHA["b2"]}),), {}, {})["queue"] == settings_queue(
        conf.cpu_queue, "h5", SHA["b2"]
    )
    assert r.smembers(keys.SETTINGS_QUEUES) == {settings_queue(conf.cpu_queue, "h5", SHA["b2"])}  # only the one used


def test_a_worker_without_the_runs_settings_hands_the_task_to_the_settings_queue(app_on_test_redis):
    conf, r = app_on_test_redis
    register(r, "gpu0@a", 0, settings={"depth": {"sha256": SHA["bbb"]}})
    handed = Job("r", "v", settings={"depth": SHA["bbb"], "h5": SHA["ccc"]})
    # Every worker of gpu0 has them by the registry, yet the task reached one that has not: beside gpu0.
    assert handoff_queue("depth", handed) == settings_queue("gpu0", "depth", SHA["bbb"])
    assert handoff_queue("h5", handed) == settings_queue(conf.cpu_queue, "h5", SHA["ccc"])  # no cpu worker yet
    # gpu1's worker has other settings and is the only one left: routing itself names the settings queue.
    register(r, "gpu1@a", 1, settings={"depth": {"sha256": SHA["aaa"]}})
    registry.remove(r, "gpu0@a")
    forget_registry()
    assert route_task("framefleet.depth", (job(settings={"depth": SHA["bbb"]}),), {}, {})["queue"] == settings_queue(
        "gpu1", "depth", SHA["bbb"]
    )
    assert handoff_queue("depth", Job("r", "v", settings={"depth": SHA["bbb"]})) == settings_queue(
        "gpu1", "depth", SHA["bbb"]
    )
    assert r.smembers(keys.SETTINGS_QUEUES) == {
        settings_queue("gpu0", "depth", SHA["bbb"]),
        settings_queue(conf.cpu_queue, "h5", SHA["ccc"]),
        settings_queue("gpu1", "depth", SHA["bbb"]),
    }


def test_a_single_live_gpu_queue_is_chosen_without_reading_queue_lengths(app_on_test_redis, monkeypatch):
    """One GPU queue hosting the stage (a one-GPU host, or a job allowed one GPU) is the choice whatever waits
    in it: no queue length is read for it, a round trip of every transition; two are weighed by their lengths."""
    _, r = app_on_test_redis
    read: list[list[str]] = []
    real = queues.lengths
    monkeypatch.setattr(queues, "lengths", lambda client, names: read.append(list(names)) or real(client, names))
    register(r, "gpu0@a", 0, busy=True)
    r.lpush("gpu0", "x", "y")
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu0" and read == []
    register(r, "gpu1@a", 1)
    forget_registry()
    assert route_task("framefleet.depth", (job(gpus=[0]),), {}, {})["queue"] == "gpu0" and read == []
    assert route_task("framefleet.depth", (job(),), {}, {})["queue"] == "gpu1" and read == [["gpu0", "gpu1"]]

"""Ownership on a real Redis: leases and claims that survive losing their keys, a reaper that requeues
only orphans, a heartbeat that survives a bad tick, and a stall report that names the real cause."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import pytest
import redis
from celery import Celery

from tasks.delivery import claims, leases, marks, requeues
from tasks.errors import ClaimLost
from tasks.observe import stall
from tasks.run import cancel
from tasks.workers import registry
from tasks.workers.heartbeat import Heartbeat
from tests.conftest import send_task, start_redis_server, wait_until
from worker_config.settings import Settings

TTL_S = 1.0
# The reaper tests' lease TTL: the reaper's gate waits this long after Redis starts, and its windows ("gone less
# than a TTL", "state published within a TTL") stay open this long between two lines of a test on a loaded machine.
REAP_TTL_S = 5.0


@pytest.fixture
def r(app_on_test_redis) -> redis.Redis:
    """A decoding client of the test's Redis, with this process's settings on it (the reaper records requeues there)."""
    return app_on_test_redis[1]


@pytest.fixture(autouse=True)
def _clean_process_state():
    yield
    leases.HELD.clear()
    leases.SHARED.clear()
    claims.HELD.clear()
    claims.PENDING.clear()


def _app(url: str) -> Celery:
    app = Celery("test-reaper", broker=url, backend=url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    return app


def _deliver(app: Celery, url: str, queue: str = "gpu0") -> tuple[str, str]:
    """Send a task and take it off its queue as kombu's Redis transport does; return (delivery tag, task id)."""
    task_id = send_task(url, "framefleet.depth", ({"video_id": "v1", "run_id": "run"},), queue)
    r = redis.Redis.from_url(url, decode_responses=True)
    payload = json.loads(r.rpop(queue))
    tag, info = payload["properties"]["delivery_tag"], payload["properties"]["delivery_info"]
    r.hset(leases.UNACKED, tag, json.dumps([payload, info["exchange"], info["routing_key"]]))
    r.zadd(leases.UNACKED_INDEX, {tag: time.time()})
    return tag, task_id


def _publish_worker(r: redis.Redis, hostname: str, held: list[str], **state) -> None:
    registry.publish(
        r,
        {
            "hostname": hostname,
            "busy": False,
            "current": None,
            "leases": held,
            "queues": ["gpu0"],
            "gpu_queues": ["gpu0"],
            "stages": ["depth"],
            "gpu": 0,
            "updated": time.time(),
            **state,
        },
        ttl_s=30,
    )


def test_a_claim_lost_with_a_redis_restart_is_re_created_by_its_holder_not_stolen(r):
    key = claims.claim_key("/out", "v1", "depth")
    assert claims.acquire(r, key, "gpu0@h t1", TTL_S) is None
    r.delete(key)  # Redis restarted without the key, or was away longer than the TTL
    assert claims.renew(r, TTL_S) == []
    assert r.get(key) == "gpu0@h t1" and 0 < r.pttl(key) <= TTL_S * 1000
    r.set(key, "gpu1@h t2")  # another worker took it meanwhile: the holder must not take it back
    assert claims.renew(r, TTL_S) == [key]
    assert r.get(key) == "gpu1@h t2"


class _Interleaved:
    """The real client, but each command queued in a pipeline first lets the task thread take a claim, as a
    thread switch at that moment would."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def pipeline(self, *args, **kwargs):
        pipe = self.r.pipeline(*args, **kwargs)
        queue = pipe.execute_command

        def execute_command(*cmd, **options):
            claims.acquire(self.r, claims.claim_key("/out", f"new{len(claims.HELD)}", "depth"), "gpu0@h t9", TTL_S)
            return queue(*cmd, **options)

        pipe.execute_command = execute_command
        return pipe

    def __getattr__(self, name: str):
        return getattr(self.r, name)


def test_claim_renewal_reads_a_snapshot_while_the_task_thread_changes_the_held_set(r):
    for i in range(3):
        claims.acquire(r, claims.claim_key("/out", f"v{i}", "depth"), f"gpu0@h t{i}", TTL_S)
    claims.renew(_Interleaved(r), TTL_S)  # no "dictionary changed size during iteration"
    assert len(claims.HELD) == 6 and all(r.get(key) for key in list(claims.HELD)[:3])


class _TaskEndsBeforeTheReassert:
    """A Redis client on which the task ends (``forget``, then its ``release``) just before the renewal
    thread's re-assert reaches Redis: the interleaving a renewal's snapshot of HELD allows."""

    def __init__(self, r: redis.Redis, hostname: str, task_id: str) -> None:
        self.r, self.hostname, self.task_id, self.ended = r, hostname, task_id, False

    def eval(self, script, *args):
        if script == leases._REASSERT and not self.ended:
            self.ended = True
            pipe = self.r.pipeline()
            leases.release(pipe, leases.forget(self.task_id), self.hostname, self.task_id)
            pipe.execute()
        return self.r.eval(script, *args)

    def __getattr__(self, name: str):
        return getattr(self.r, name)


def test_a_renewal_racing_the_task_end_leaves_no_lease_or_owner_record(r):
    lease, owner = leases.LEASE_PREFIX + "tag1", leases.OWNER_PREFIX + "tag1"
    assert leases.grant(r, "tag1", "t1", "gpu0@h", TTL_S) is None
    assert r.exists(lease, owner) == 2
    assert leases.renew(_TaskEndsBeforeTheReassert(r, "gpu0@h", "t1"), "gpu0@h", TTL_S) == 0
    assert r.exists(lease, owner) == 0  # the re-assert re-created them after the release; the renewal removes them


def test_a_task_of_a_cancelled_run_stops_at_its_claim_and_takes_none(r):
    key = claims.claim_key("/out", "v1", "depth")
    flag = cancel.flag_key("run1")
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S, cancel_key=flag).action == "run"
    claims.finish(r, "t1", succeeded=False, done_ttl_s=60)
    assert r.get(key) is None
    cancel.request(r, "run1", ttl_s=60)
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S, cancel_key=flag).action == "cancelled"
    assert r.get(key) is None and key not in claims.HELD


def test_a_task_end_writes_its_counts_marks_it_done_and_releases_its_claim(r):
    key = claims.claim_key("/out", "v1", "depth")
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S, run_id="x").action == "run"
    claims.finish(r, "t1", succeeded=True, done_ttl_s=60, before=lambda pipe: pipe.hincrby("ff:run:x", "n", 1))
    assert r.hget("ff:run:x", "n") == "1" and claims.is_done(r, "x", "t1") and r.get(key) is None
    assert 0 < r.ttl(marks.where(r, "x", "t1").done_key) <= 60  # the run's done marks: gone with the run
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S, run_id="x").action == "drop"


def test_a_task_of_an_ended_run_is_dropped_without_its_done_mark(r):
    """Once the run has ended (tasks.run.completion.retire) its done marks are gone; its end mark drops
    every later delivery of its tasks, and nothing is claimed."""
    from tasks.run import completion

    key = claims.claim_key("/out", "v1", "depth")
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S, run_id="x").action == "run"
    claims.finish(r, "t1", succeeded=True, done_ttl_s=60)
    completion.retire(r, "x", keep_s=60)
    assert not r.exists(marks.where(r, "x", "t1").done_key)
    verdict = claims.decide(r, key, "t1", "gpu0@h", TTL_S, run_id="x")
    assert verdict.action == "drop" and "has ended" in verdict.why, verdict
    assert claims.decide(r, key, "t2", "gpu0@h", TTL_S, run_id="x").action == "drop"  # any task of the run
    assert r.get(key) is None and key not in claims.HELD
    assert claims.decide(r, key, "t3", "gpu0@h", TTL_S, run_id="y").action == "run"  # another run's


def _key_events(r: redis.Redis, keys: set[str], act: Callable[[], None]) -> list[tuple[str, str]]:
    """The (key, event) pairs Redis reports for ``keys`` while ``act`` runs, in the order Redis applied them."""
    db = r.connection_pool.connection_kwargs.get("db", 0)
    old = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
    r.config_set("notify-keyspace-events", "Kghs$")  # keyspace events of generic, hash, set and string commands
    sub = r.pubsub(ignore_subscribe_messages=True)
    try:
        sub.psubscribe(f"__keyspace@{db}__:*")
        wait_until(lambda: r.pubsub_numpat() > 0, 10, "the keyspace subscription")
        act()
        events: list[tuple[str, str]] = []

        def collect() -> bool:
            while (message := sub.get_message(timeout=0.05)) is not None:
                key = message["channel"].split(":", 1)[1]
                if key in keys:
                    events.append((key, message["data"]))
            return {k for k, _ in events} >= keys

        wait_until(collect, 10, f"keyspace events of {keys}", poll_s=0)
        return events
    finally:
        sub.close()
        r.config_set("notify-keyspace-events", old)


def test_a_task_end_sets_the_done_mark_before_it_releases_the_claim(r):
    """A duplicate arriving between the two writes sees the claim or the done mark, never neither."""
    key = claims.claim_key("/out", "v1", "depth")
    done = marks.where(r, "run", "t1").done_key
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S, run_id="run").action == "run"
    events = _key_events(r, {key, done}, lambda: claims.finish(r, "t1", succeeded=True, done_ttl_s=60))
    order = [e for e in events if e in ((done, "sadd"), (key, "del"))]
    assert order == [(done, "sadd"), (key, "del")], events


def test_a_claim_lives_one_lease_ttl_whether_taken_fresh_or_over(r):
    """A claim's TTL is the lease TTL (re-asserted by the heartbeat): longer would block a takeover, shorter lapse."""
    key = claims.claim_key("/out", "v1", "depth")
    ttl_ms = int(TTL_S * 1000)
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S).action == "run"
    assert ttl_ms - 500 < r.pttl(key) <= ttl_ms
    claims.HELD.clear()  # the redelivery runs in another worker process
    claims.PENDING.clear()
    r.set(key, "gpu9@gone t1")  # its holder is not registered: the redelivery takes it over
    verdict = claims.decide(r, key, "t1", "gpu1@h", TTL_S)
    assert verdict == claims.Verdict("run", "gpu9@gone t1") and r.get(key) == "gpu1@h t1"
    assert ttl_ms - 500 < r.pttl(key) <= ttl_ms
    claims.finish(r, "t1", succeeded=True, done_ttl_s=60)  # the claim taken over is the one its end releases
    assert r.get(key) is None and claims.is_done(r, "", "t1")


def test_each_verdict_names_the_holder_the_pipeline_acts_on(r):
    """``holder`` tells a delivery dropped as finished ("": its end may be unseen) from one dropped as running."""
    key = claims.claim_key("/out", "v1", "depth")
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S) == claims.Verdict("run")
    _publish_worker(r, "gpu0@h", [], busy=True, current={"task": "framefleet.depth", "task_id": "t1"})
    dropped = claims.decide(r, key, "t1", "gpu1@h", TTL_S)
    assert (dropped.action, dropped.holder) == ("drop", "gpu0@h t1")
    waiting = claims.decide(r, key, "t2", "gpu1@h", TTL_S)
    assert (waiting.action, waiting.holder) == ("wait", "gpu0@h t1")
    claims.finish(r, "t1", succeeded=True, done_ttl_s=60)
    finished = claims.decide(r, key, "t1", "gpu1@h", TTL_S)
    assert (finished.action, finished.holder) == ("drop", "")
    assert r.get(key) is None  # released at t1's end
    r.set("ff:cancel:run", "1")
    assert claims.decide(r, key, "t4", "gpu1@h", TTL_S, cancel_key="ff:cancel:run").action == "cancelled"
    assert r.get(key) is None  # a cancelled run claims nothing


def test_a_task_end_never_raises_even_for_a_claim_it_lost_or_never_took(r):
    key = claims.claim_key("/out", "v1", "depth")
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S).action == "run"
    r.set(key, "gpu1@h t1")  # ours lapsed while cut off; another worker took it over
    with pytest.raises(ClaimLost):
        claims.confirm(r, key, TTL_S)
    assert key not in claims.HELD  # the heartbeat no longer renews a claim another run holds
    claims.finish(r, "t1", succeeded=False, done_ttl_s=60)
    claims.finish(r, "never-claimed", succeeded=True, done_ttl_s=60)  # e.g. Redis was away at its start
    assert r.get(key) == "gpu1@h t1" and not claims.is_done(r, "", "t1")  # a failure marks nothing
    assert not claims.is_done(r, "", "never-claimed")  # no claim, no done mark: nothing asks for one


def test_claim_keys_differ_per_output_root_video_and_stage():
    keys = {claims.claim_key(root, vid, stage) for root in ("/a", "/b") for vid in ("v1", "v2") for stage in ("d", "t")}
    assert len(keys) == 8


def test_a_claim_taken_by_hand_never_overwrites_another_s_and_lives_a_ttl(r):
    key = claims.claim_key("/out", "v1", "depth")
    assert claims.acquire(r, key, "gpu0@h t1", TTL_S) is None
    assert 0 < r.pttl(key) <= TTL_S * 1000 and claims.HELD[key] == "gpu0@h t1"
    claims.HELD.clear()  # a retry of this very task in a fresh process: its claim is its own, and renewed
    assert claims.acquire(r, key, "gpu0@h t1", TTL_S) is None
    assert dict(claims.HELD) == {key: "gpu0@h t1"}
    assert claims.acquire(r, key, "gpu1@h t2", TTL_S) == "gpu0@h t1" and r.get(key) == "gpu0@h t1"


def test_done_marks_outlive_any_redelivery_of_the_message():
    assert claims.marks_ttl_s(3600) >= 3600 + 3600  # past the visibility timeout, with a wait in the queue


class Interleaved(redis.Redis):
    """A real Redis client that runs ``then`` once, right after the first command ``when(args)`` picks has
    returned: another worker's write landing between two round trips of the code under test."""

    def __init__(self, url: str, when: Callable[[tuple], bool], then: Callable[[], object]) -> None:
        super().__init__(connection_pool=redis.ConnectionPool.from_url(url, decode_responses=True))
        self.when = when
        self.then: Callable[[], object] | None = then

    def execute_command(self, *args, **options):
        result = super().execute_command(*args, **options)
        if self.then is not None and self.when(args):
            then, self.then = self.then, None
            then()
        return result


def test_a_claim_retaken_between_the_fence_s_two_round_trips_is_not_overwritten(redis_url, r):
    """hostB's claim lapsed; hostA takes the stage right after hostB's fence read it free: hostB publishes nothing."""
    key = claims.claim_key("/out", "v1", "depth")
    assert claims.decide(r, key, "t1", "gpu0@hostB", TTL_S).action == "run"
    r.delete(key)
    racing = Interleaved(redis_url, lambda args: args[0] == "GET", lambda: r.set(key, "gpu0@hostA t1"))
    with pytest.raises(ClaimLost, match="gpu0@hostA t1"):
        claims.confirm(racing, key, TTL_S)
    assert r.get(key) == "gpu0@hostA t1"


def test_a_takeover_that_loses_the_race_for_a_dead_holder_s_claim_waits(redis_url, r):
    """Two redeliveries of a task whose worker died: the one whose take-over comes second waits for the first."""
    key = claims.claim_key("/out", "v1", "depth")
    r.set(key, "gpu9@gone t1")
    begun = lambda args: args[0] == "EVAL" and args[1] == claims._BEGIN  # noqa: E731
    racing = Interleaved(redis_url, begun, lambda: r.set(key, "gpu2@h t1"))
    verdict = claims.decide(racing, key, "t1", "gpu1@h", TTL_S)
    assert (verdict.action, verdict.holder) == ("wait", "gpu2@h t1") and r.get(key) == "gpu2@h t1"
    assert key not in claims.HELD and "t1" not in claims.PENDING


def test_a_claim_that_lapses_between_a_refused_take_and_the_read_is_taken(redis_url, r):
    """The holder's claim expires right after SET NX refused ours: the claim is free, so it is ours, and held."""
    key = claims.claim_key("/out", "v1", "depth")
    r.set(key, "gpu0@h t1")
    refused = lambda args: args[0] == "SET" and args[1] == key  # noqa: E731
    racing = Interleaved(redis_url, refused, lambda: r.delete(key))
    assert claims.acquire(racing, key, "gpu1@h t2", TTL_S) is None
    assert r.get(key) == "gpu1@h t2" and 0 < r.pttl(key) <= TTL_S * 1000 and claims.HELD[key] == "gpu1@h t2"


def test_a_duplicate_is_dropped_only_while_its_holder_runs_the_task(r):
    key = claims.claim_key("/out", "v1", "depth")
    assert claims.decide(r, key, "t1", "gpu0@h", TTL_S).action == "run"
    _publish_worker(r, "gpu0@h", [], busy=True, current={"task": "framefleet.depth", "task_id": "t1"})
    assert claims.decide(r, key, "t1", "gpu1@h", TTL_S).action == "drop"
    # The holder died (its registry entry is gone): the redelivery takes the claim over and runs.
    registry.remove(r, "gpu0@h")
    verdict = claims.decide(r, key, "t1", "gpu1@h", TTL_S)
    assert verdict.action == "run" and r.get(key) == "gpu1@h t1"
    # Another task of the same stage and video waits; a finished task id is dropped.
    assert claims.decide(r, key, "t2", "gpu0@h", TTL_S).action == "wait"
    claims.finish(r, "t1", succeeded=True, done_ttl_s=60)
    assert r.get(key) is None and claims.decide(r, key, "t1", "gpu0@h", TTL_S).action == "drop"


def test_a_lease_and_unacked_entry_lost_with_redis_are_re_asserted_by_the_holder(redis_url, r):
    app = _app(redis_url)
    tag, task_id = _deliver(app, redis_url)
    entry = r.hget(leases.UNACKED, tag)
    assert leases.grant(r, tag, task_id, "gpu0@h", TTL_S, entry) is None
    assert r.get(leases.LEASE_PREFIX + tag) == r.get(leases.OWNER_PREFIX + tag) == f"gpu0@h {task_id}"
    delivered_at = r.zscore(leases.UNACKED_INDEX, tag)
    r.delete(leases.LEASE_PREFIX + tag, leases.OWNER_PREFIX + tag)
    r.hdel(leases.UNACKED, tag)  # e.g. a duplicate delivery's ack under the same tag
    assert leases.renew(r, "gpu0@h", TTL_S) == 1
    assert r.get(leases.LEASE_PREFIX + tag) == f"gpu0@h {task_id}" and r.pttl(leases.LEASE_PREFIX + tag) > 0
    assert r.get(leases.OWNER_PREFIX + tag) == f"gpu0@h {task_id}" and r.ttl(leases.OWNER_PREFIX + tag) > 0
    # The entry comes back; its delivery time stays the first one (the message does not look younger).
    assert r.hget(leases.UNACKED, tag) == entry and r.zscore(leases.UNACKED_INDEX, tag) == delivered_at
    app.close()


def test_a_lease_another_worker_holds_is_neither_taken_nor_counted(redis_url, r):
    """A duplicate delivery under the same tag leaves the lease to its holder, at grant and at every renewal."""
    app = _app(redis_url)
    shared, task_id = _deliver(app, redis_url)
    mine, my_task = _deliver(app, redis_url)
    assert leases.grant(r, shared, task_id, "gpu0@a", TTL_S) is None
    leases.HELD.clear()  # gpu0@a is another process
    assert leases.grant(r, shared, task_id, "gpu1@b", TTL_S) == f"gpu0@a {task_id}"
    also, also_task = _deliver(app, redis_url)
    assert leases.grant(r, mine, my_task, "gpu1@b", TTL_S) is None
    assert leases.grant(r, also, also_task, "gpu1@b", TTL_S) is None
    assert list(leases.HELD) == [shared, mine, also]  # the shared one first: a renewal goes on past it
    r.delete(leases.LEASE_PREFIX + mine)
    assert leases.renew(r, "gpu1@b", TTL_S) == 2
    assert r.get(leases.LEASE_PREFIX + shared) == r.get(leases.OWNER_PREFIX + shared) == f"gpu0@a {task_id}"
    assert r.get(leases.LEASE_PREFIX + mine) == f"gpu1@b {my_task}"
    app.close()


def _age(r: redis.Redis, tag: str, seconds: float) -> None:
    r.zadd(leases.UNACKED_INDEX, {tag: time.time() - seconds})


def _settled(r: redis.Redis) -> None:
    """Wait for the reaper's gate: this session's Redis has been up a lease TTL (it reaps nothing before)."""
    wait_until(lambda: leases.settled(r, r, REAP_TTL_S), REAP_TTL_S + 10, "the reaper's gate (Redis up a TTL)")


def test_the_reaper_requeues_nothing_while_redis_is_younger_than_a_lease_ttl(redis_url, r):
    """After a Redis restart every live holder first gets a heartbeat to re-assert the leases Redis lost."""
    app = _app(redis_url)
    tag, task_id = _deliver(app, redis_url)
    leases.grant(r, tag, task_id, "gpu0@h", REAP_TTL_S)
    leases.HELD.clear()
    r.delete(leases.LEASE_PREFIX + tag)
    _age(r, tag, 10 * REAP_TTL_S)
    _publish_worker(r, "gpu0@h", [])  # requeued once Redis has settled: its live owner lists nothing (below)
    young = leases.redis_uptime_s(r) + 3600  # a TTL longer than this Redis has been up
    assert not leases.settled(r, r, young)
    assert leases.reap(app, r, r, young) == [] and r.llen("gpu0") == 0 and r.hexists(leases.UNACKED, tag)
    app.close()


def test_the_reaper_waits_until_the_workers_redis_too_has_been_up_a_ttl(redis_url, r):
    """The workers' Redis, another server than the broker, came back from its snapshot: the workers' states
    expired while it was down and their last-seen times are old, so a live holder looks long gone until its
    next heartbeat. The broker has been up for ages; the reaper still waits for the younger server."""
    _settled(r)
    url, stop = start_redis_server()
    try:
        fresh = redis.Redis.from_url(url, decode_responses=True)
        app = _app(redis_url)
        tag, task_id = _deliver(app, redis_url)
        leases.grant(r, tag, task_id, "gpu0@h", REAP_TTL_S)
        leases.HELD.clear()
        r.delete(leases.LEASE_PREFIX + tag)  # lapsed while the workers' Redis was away
        _age(r, tag, 10 * leases.redis_uptime_s(r))
        fresh.hset(registry.SEEN_KEY, "gpu0@h", str(time.time() - 10 * leases.redis_uptime_s(r)))
        # A TTL as long as the broker has been up: it has, the server started since has not.
        assert leases.reap(app, r, fresh, leases.redis_uptime_s(r)) == [] and r.llen("gpu0") == 0
        assert r.hexists(leases.UNACKED, tag)
        # Once the workers' Redis has been up a TTL the same message goes back: the gate held it, nothing else.
        wait_until(lambda: leases.redis_uptime_s(fresh) >= 1, 10, "the second redis-server up a second")
        r.delete(leases.REAPER_LOCK)
        assert leases.reap(app, r, fresh, 1) == [tag] and r.llen("gpu0") == 1
        app.close()
    finally:
        stop()


def test_the_reaper_requeues_only_what_no_live_worker_holds(redis_url, r):
    _settled(r)
    app = _app(redis_url)
    tag, task_id = _deliver(app, redis_url)
    leases.grant(r, tag, task_id, "gpu0@h", REAP_TTL_S)
    leases.HELD.clear()
    r.delete(leases.LEASE_PREFIX + tag)  # lapsed
    _age(r, tag, 10 * REAP_TTL_S)
    # Its worker is alive and lists the message: it re-asserts at its next heartbeat; no requeue.
    _publish_worker(r, "gpu0@h", [tag], busy=True)
    assert leases.reap(app, r, r, REAP_TTL_S) == [] and r.llen("gpu0") == 0
    # Gone, but not yet for a lease TTL: still no requeue.
    registry.remove(r, "gpu0@h")
    r.delete(leases.REAPER_LOCK)
    assert leases.reap(app, r, r, REAP_TTL_S) == []
    # Gone longer than the TTL: requeued.
    r.hset(registry.SEEN_KEY, "gpu0@h", str(time.time() - 10 * REAP_TTL_S))
    r.delete(leases.REAPER_LOCK)
    assert leases.reap(app, r, r, REAP_TTL_S) == [tag]
    assert r.llen("gpu0") == 1 and not r.hexists(leases.UNACKED, tag)
    app.close()


def test_a_message_never_leased_is_requeued_once_it_has_stayed_unowned_a_whole_ttl(redis_url, r):
    """Its worker died between the delivery and the lease: no owner record. The first look only starts the clock."""
    _settled(r)
    app = _app(redis_url)
    young, _ = _deliver(app, redis_url)  # delivered just now: not looked at yet
    tags = [_deliver(app, redis_url)[0] for _ in range(3)]
    for tag in tags:
        _age(r, tag, 10 * REAP_TTL_S)
    assert leases.reap(app, r, r, REAP_TTL_S) == [] and r.llen("gpu0") == 0
    assert 0 < r.pttl(leases.REAPER_LOCK) <= REAP_TTL_S * 500  # one reaper at a time, for half a TTL
    first_seen = {tag: float(r.get(leases.ORPHAN_PREFIX + tag)) for tag in tags}
    assert all(abs(at - registry.redis_now(r)) < REAP_TTL_S for at in first_seen.values())
    assert all(r.pttl(leases.ORPHAN_PREFIX + tag) > 0 for tag in tags) and not r.exists(leases.ORPHAN_PREFIX + young)
    assert leases.reap(app, r, r, REAP_TTL_S) == []  # the lock: no second reaper meanwhile
    r.delete(leases.REAPER_LOCK)
    assert leases.reap(app, r, r, REAP_TTL_S) == []  # seen again within the TTL: the first sighting stands
    assert {tag: float(r.get(leases.ORPHAN_PREFIX + tag)) for tag in tags} == first_seen
    for tag in tags:
        r.set(leases.ORPHAN_PREFIX + tag, str(registry.redis_now(r) - 2 * REAP_TTL_S))
    assert leases.reap(app, r, r, REAP_TTL_S) == []  # orphans now, but another reaper holds the lock
    r.delete(leases.REAPER_LOCK)
    assert sorted(leases.reap(app, r, r, REAP_TTL_S)) == sorted(tags) and r.llen("gpu0") == 3
    assert not any(r.exists(leases.ORPHAN_PREFIX + tag) for tag in tags)
    assert r.hexists(leases.UNACKED, young) and not any(r.hexists(leases.UNACKED, tag) for tag in tags)
    app.close()


def test_a_requeued_message_goes_first_and_its_requeue_is_recorded(redis_url, r):
    _settled(r)
    app = _app(redis_url)
    tag, task_id = _deliver(app, redis_url)
    leases.grant(r, tag, task_id, "gpu0@h", REAP_TTL_S)
    leases.HELD.clear()
    r.delete(leases.LEASE_PREFIX + tag)
    waiting = send_task(redis_url, "framefleet.depth", ({"video_id": "v2", "run_id": "run"},), "gpu0")
    _publish_worker(r, "gpu0@h", [])
    assert leases.reap(app, r, r, REAP_TTL_S) == [tag] and not r.exists(leases.OWNER_PREFIX + tag)
    consumed = [json.loads(r.rpop("gpu0"))["headers"]["id"] for _ in range(2)]  # kombu consumes from the right
    assert consumed == [task_id, waiting]  # it was already under way: ahead of what waits
    [requeue] = requeues.read(r, "run")
    assert (requeue["task"], requeue["video_id"]) == (task_id, "v1") and "lease lapsed" in requeue["why"]
    app.close()


def test_a_worker_state_without_a_lease_list_or_gone_stale_keeps_its_messages(redis_url, r):
    """An older worker (no ``leases`` in its state) or one whose state is older than a TTL is not judged by it."""
    _settled(r)
    app = _app(redis_url)
    tag, task_id = _deliver(app, redis_url)
    leases.grant(r, tag, task_id, "gpu0@h", REAP_TTL_S)
    leases.HELD.clear()
    r.delete(leases.LEASE_PREFIX + tag)
    _publish_worker(r, "gpu0@h", [])
    state = json.loads(r.get(registry.WORKER_PREFIX + "gpu0@h"))
    r.set(registry.WORKER_PREFIX + "gpu0@h", json.dumps({k: v for k, v in state.items() if k != "leases"}))
    assert leases.reap(app, r, r, REAP_TTL_S) == []
    r.set(registry.WORKER_PREFIX + "gpu0@h", json.dumps({**state, "updated": time.time() - 10 * REAP_TTL_S}))
    r.delete(leases.REAPER_LOCK)
    assert leases.reap(app, r, r, REAP_TTL_S) == [] and r.llen("gpu0") == 0
    app.close()


def test_a_message_whose_live_owner_no_longer_holds_it_is_requeued(redis_url, r):
    """Its ack was lost (Redis away at the time): the idle owner lists nothing, so nothing waits forever."""
    _settled(r)
    app = _app(redis_url)
    tag, task_id = _deliver(app, redis_url)
    leases.grant(r, tag, task_id, "gpu0@h", REAP_TTL_S)
    leases.HELD.clear()
    r.delete(leases.LEASE_PREFIX + tag)
    _age(r, tag, 10 * REAP_TTL_S)
    _publish_worker(r, "gpu0@h", [])
    assert leases.reap(app, r, r, REAP_TTL_S) == [tag] and r.llen("gpu0") == 1
    app.close()


def _conf(redis_url: str, **extra) -> Settings:
    return Settings(redis_url=redis_url, lease_ttl_s=TTL_S, **extra)


def test_the_stall_report_names_a_message_held_by_an_idle_worker(redis_url, r):
    app = _app(redis_url)
    tag, task_id = _deliver(app, redis_url)
    leases.grant(r, tag, task_id, "gpu0@h", TTL_S)
    _age(r, tag, 30)
    _publish_worker(r, "gpu0@h", [])
    why = "; ".join(stall.diagnose(r, r, _conf(redis_url)))
    assert f"depth of v1 (task {task_id}): held in unacked" in why and "gpu0@h, which is idle" in why, why
    app.close()


def test_the_stall_report_names_a_message_held_by_a_worker_that_is_gone(redis_url, r):
    app = _app(redis_url)
    tag, task_id = _deliver(app, redis_url)
    leases.grant(r, tag, task_id, "gpu7@h", TTL_S)
    _age(r, tag, 30)
    # Missing from the registry with its lease live (a Redis restart, its state not yet published again): it
    # renews the lease, so it is not called gone.
    assert not any("which is gone" in line for line in stall.diagnose(r, r, _conf(redis_url)))
    r.delete(leases.LEASE_PREFIX + tag)  # its lease lapsed
    r.hset("ff:worker-seen", "gpu7@h", str(registry.redis_now(r) - 30))  # last heard from 30 s ago
    why = "; ".join(stall.diagnose(r, r, _conf(redis_url)))
    assert f"task {task_id}): held in unacked" in why and "gpu7@h, which is gone (not heard from for 30 s" in why, why
    app.close()


def test_the_stall_report_names_a_worker_past_its_deadline(redis_url, r):
    started = time.time() - 100
    _publish_worker(r, "gpu0@h", [], busy=True, current={"task": "framefleet.depth", "video": "v9", "started": started})
    conf = _conf(redis_url, stages={"depth": {"deadline_s": 50}})
    why = "; ".join(stall.diagnose(r, r, conf))
    assert "worker gpu0@h: depth of v9 running" in why and "past its 50 s deadline" in why, why


def test_the_run_s_messages_are_found_in_queues_and_unacked_and_missed_when_gone(redis_url, r):
    app = _app(redis_url)
    conf = _conf(redis_url)
    _deliver(app, redis_url)  # one in unacked
    send_task(redis_url, "framefleet.h5", ({"video_id": "v2", "run_id": "run"},), "cpu")  # one waiting
    send_task(redis_url, "framefleet.h5", ({"video_id": "v3", "run_id": "other"},), "cpu")
    assert stall.run_messages(r, r, conf, "run", "callback-id") == 2
    r.flushdb()
    assert stall.run_messages(r, r, conf, "run", "callback-id") == 0
    app.close()


def test_the_heartbeat_survives_a_failing_tick_and_counts_it(redis_url, r, monkeypatch):
    from tasks import celery_app

    monkeypatch.setattr(
        celery_app, "_settings", Settings(redis_url=redis_url, heartbeat_interval_s=0.05, registry_ttl_s=5)
    )
    ticks = {"n": 0}

    def state() -> dict:
        ticks["n"] += 1
        if ticks["n"] == 2:
            raise ValueError("a bad tick")  # any exception, from any part of the tick
        return {"hostname": "hb@test", "busy": False, "current": None, "gpu_queues": []}

    app = _app(redis_url)
    beat = Heartbeat(app, state)
    beat.start()
    try:
        published = wait_until(
            lambda: (
                (raw := r.get(registry.WORKER_PREFIX + "hb@test"))
                and json.loads(raw).get("heartbeat_errors", 0) >= 1
                and json.loads(raw)
            ),
            20,
            "a state published after the failing tick",
        )
        assert beat.is_alive() and published["heartbeat_errors"] == 1
    finally:
        beat.stopping.set()
        beat.join(5)
        app.close()


def test_the_deadline_ends_a_task_in_its_stage_but_not_one_whose_output_is_written(redis_url, monkeypatch):
    """A task past its deadline whose output is committed only has its next stage to send: it is not killed."""
    from tasks.workers import heartbeat

    conf = Settings(redis_url=redis_url, stages={"preprocess": {"deadline_s": 0.05}})
    exits: list[int] = []
    monkeypatch.setattr(heartbeat.os, "_exit", exits.append)
    monkeypatch.setattr(heartbeat.logging, "shutdown", lambda: None)
    beat = Heartbeat(_app(redis_url), lambda: {})
    running = {"task": "framefleet.preprocess", "video": "v", "started": time.time() - 1.0}
    beat.enforce_deadline({"current": {**running, "committed": time.time()}}, conf)
    assert exits == []
    beat.enforce_deadline({"current": running}, conf)
    assert exits == [70]
    beat.app.close()


def test_the_stall_report_tells_a_slurm_user_to_submit_the_job_again_not_to_start_a_bare_worker(
    redis_url, r, tmp_path, monkeypatch
):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    send_task(redis_url, "framefleet.depth", ({"run_id": "r", "video_id": "v"},), "gpu1")
    send_task(redis_url, "framefleet.preprocess", ({"run_id": "r", "video_id": "w"},), "cpu")
    bare = "; ".join(stall.diagnose(r, r, _conf(redis_url)))
    assert "queue gpu1: 1 tasks waiting and no live worker; start one with `" in bare and "sbatch" not in bare, bare
    slurm = tmp_path / "slurm-bin"  # a login node: Slurm's commands on PATH
    slurm.mkdir()
    (slurm / "sbatch").write_text("#!/bin/sh\nexit 0\n")
    (slurm / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{slurm}{os.pathsep}{os.environ['PATH']}")
    installed_only = "; ".join(stall.diagnose(r, r, _conf(redis_url)))  # Slurm's package, no cluster configured
    assert "start one with `" in installed_only and "sbatch" not in installed_only, installed_only
    (tmp_path / "slurm.conf").write_text("ClusterName=lab\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.setenv("FRAMEFLEET_HOME", "/srv/framefleet")
    why = stall.diagnose(r, r, _conf(redis_url))
    (gpu,) = [line for line in why if line.startswith("queue gpu1:")]
    assert (
        "submit the GPU job again" in gpu
        and "`sbatch --gres=gpu:2 /srv/framefleet/deploy/slurm/framefleet-gpu.sbatch`" in gpu
    ), gpu
    (cpu,) = [line for line in why if line.startswith("queue cpu:")]
    assert "`sbatch /srv/framefleet/deploy/slurm/framefleet-cpu.sbatch`" in cpu and "celery" not in cpu, cpu

"""The broker transport: an ack that Redis refuses still frees the worker's prefetch slot.

A real redis-server, stopped between the delivery and the ack, and kombu's own channel.
"""

from __future__ import annotations

import contextlib
import subprocess

import kombu
import pytest
import redis

import tasks.celery_app  # noqa: F401  (installs the transport)
from tasks.delivery import transport
from tasks.redis_client import free_port, server_argv
from tests.conftest import wait_until


@pytest.fixture
def broker(tmp_path):
    port = free_port()
    proc = subprocess.Popen(server_argv(port, tmp_path), stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    wait_until(lambda: _answers(url), 10, "the private redis-server", poll_s=0.02)
    with kombu.Connection(url) as conn:  # redis:// resolves to tasks.delivery.transport (installed by tasks.celery_app)
        try:
            yield conn, proc
        finally:  # before the connection closes: a BRPOP left waiting (a test failed) then fails instead of blocking
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _stopped_at_end(proc: subprocess.Popen):
    """Stop the server before a connection opened with it closes: a BRPOP left waiting then fails, not blocks."""
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url).ping())
    except redis.ConnectionError:
        return False


def _delivered(conn: kombu.Connection) -> tuple[object, kombu.Message]:
    """A message taken (not acked) on a channel with a prefetch of 1, as a solo worker takes one."""
    channel = conn.channel()
    channel.basic_qos(0, 1, False)
    queue = kombu.Queue("q", routing_key="q")
    kombu.Producer(channel).publish({"n": 1}, routing_key="q", declare=[queue])
    message = queue(channel).get(no_ack=False)
    assert message is not None and not channel.qos.can_consume()  # the one prefetch slot is taken
    return channel, message


@pytest.mark.parametrize("end", ["ack", "reject", "requeue"])
def test_a_message_ended_while_redis_is_away_frees_the_prefetch_slot(broker, monkeypatch, caplog, end):
    conn, proc = broker
    monkeypatch.setattr(transport, "RETRY_DELAYS_S", (0.05,))
    channel, message = _delivered(conn)
    proc.kill()
    proc.wait()
    if end == "ack":
        message.ack()
    else:
        message.reject(requeue=end == "requeue")
    assert channel.qos.can_consume()  # kombu's own QoS keeps the tag and never consumes again
    assert f"{end} of message" in caplog.text and "stays in unacked" in caplog.text


def test_redis_brokers_use_this_transport_and_still_read_redis_urls():
    from tasks import app

    conn = app.connection_for_read("redis://:secret@127.0.0.1:1/0")
    assert isinstance(conn.transport, transport.Transport)
    assert conn.as_uri() == "redis://:**@127.0.0.1:1/0"  # Flower's broker view and the banner read this
    assert isinstance(app.connection_for_read("sentinel://127.0.0.1:1").transport, transport.SentinelTransport)


# The kombu 5.7.0 code tasks.delivery.transport replaces or relies on, by the SHA-256 of its source (first 16
# hex digits). A change here means kombu changed under the atomic delivery: read the new code, port
# tasks.delivery.transport to it, then update the digest (and the pin in pyproject.toml).
KOMBU_CODE = {
    "redis.Channel._brpop_start": "06723d707ddf2240",
    "redis.Channel._brpop_read": "c42518699709f2df",
    "redis.Channel._put": "1c0cf9749576614c",
    "redis.Channel._do_restore_message": "8b430df94e45b5b0",
    "redis.Channel.close": "101e9b9cdad44b88",
    "redis.Channel.get_table": "a4ba78a2265370f2",
    "redis.QoS.append": "35c655f6ecc62fe6",
    "redis.QoS.restore_by_tag": "58e161d81b6fe18d",
    "virtual.Channel.basic_consume": "0fec962694938b61",
    "virtual.Channel.basic_get": "ba4884c15b6bed6d",
    "virtual.Channel._lookup": "82b0e60149b5e172",
    "virtual.Transport._deliver": "799e242f3ec53863",
    "virtual.Transport._reject_inbound_message": "0fd42f24d40a132d",
    "redis.MultiChannelPoller._register_BRPOP": "85724582464a615f",
    "redis.MultiChannelPoller.handle_event": "a96a90b9df4bd447",
    "redis.Channel._connparams": "e9a4295085a8fb90",
    "redis.Channel._receive_one": "d59b8751d89757dc",
    "redis.MultiChannelPoller._client_registered": "a16964c3e3d29356",
}


def test_the_kombu_code_the_transport_replaces_is_the_code_it_was_written_against():
    import hashlib
    import inspect

    from kombu.transport import redis as kombu_redis
    from kombu.transport.virtual import base

    assert kombu.__version__ == "5.7.0", f"kombu {kombu.__version__}: tasks.delivery.transport was written for 5.7.0"
    modules = {"redis": kombu_redis, "virtual": base}
    changed = []
    for name, digest in KOMBU_CODE.items():
        module, cls, method = name.split(".")
        source = inspect.getsource(getattr(getattr(modules[module], cls), method))
        if hashlib.sha256(source.encode()).hexdigest()[:16] != digest:
            changed.append(name)
    assert not changed, f"kombu code changed under tasks.delivery.transport: {changed}; port it, then update these"


def _server(tmp_path, persistent: bool, port: int | None = None) -> tuple[subprocess.Popen, int]:
    port = port or free_port()
    proc = subprocess.Popen(server_argv(port, tmp_path, persistent=persistent), stdout=subprocess.DEVNULL)
    wait_until(lambda: _answers(f"redis://127.0.0.1:{port}/0"), 10, "the private redis-server", poll_s=0.02)
    return proc, port


def test_a_taken_message_has_the_unacked_entry_kombu_writes_and_priorities_hold(broker):
    import json

    conn, _ = broker
    channel = conn.channel()
    queue = kombu.Queue("q", routing_key="q")
    producer = kombu.Producer(channel)
    producer.publish({"n": "low"}, routing_key="q", declare=[queue], priority=7)
    producer.publish({"n": "high"}, routing_key="q", declare=[queue], priority=0)
    first = queue(channel).get(no_ack=False)
    assert first.payload == {"n": "high"}
    client = channel.client
    entry = json.loads(client.hget(channel.unacked_key, first.delivery_tag))
    info = first.delivery_info
    assert entry == json.loads(json.dumps([first._raw, info["exchange"], info["routing_key"]]))  # kombu's QoS.append
    assert client.zscore(channel.unacked_index_key, first.delivery_tag) is not None
    assert queue(channel).get(no_ack=True).payload == {"n": "low"}
    assert client.hlen(channel.unacked_key) == 1  # a consumer that does not ack leaves no entry


def test_a_message_popped_as_redis_goes_away_stays_in_its_queue(tmp_path):
    """Mechanism A (../shared/repro/redis-loss/e1): a pending BRPOP, Redis stops before the reply is read."""
    import socket

    proc, port = _server(tmp_path, persistent=True)
    url = f"redis://127.0.0.1:{port}/0"
    queue = kombu.Queue("gpu1", kombu.Exchange("gpu1", "direct"), "gpu1")
    got = []
    conn = kombu.Connection(url)
    try:
        consumer = kombu.Consumer(conn.default_channel, [queue], callbacks=[lambda body, m: got.append(body)])
        consumer.qos(prefetch_count=1)
        consumer.consume()
        with pytest.raises(socket.timeout):
            conn.drain_events(timeout=0.05)  # sends the blocking pop; nothing is queued yet
        with kombu.Connection(url) as sender:
            kombu.Producer(sender).publish("M", exchange="", routing_key="gpu1", declare=[queue])
        r = redis.Redis(port=port)
        # taken by the pending pop: the ring (tasks.delivery.transport), or with kombu's own BRPOP the message
        wait_until(lambda: not (r.llen("gpu1") and r.llen("ff:bell:gpu1")), 5, "the pending pop to take")
        proc.terminate()
        proc.wait()
        with pytest.raises((redis.ConnectionError, OSError)):
            conn.drain_events(timeout=3)
        with contextlib.suppress(redis.ConnectionError, OSError):
            conn.close()  # what Celery's consumer restart does
        proc = subprocess.Popen(server_argv(port, tmp_path, persistent=True), stdout=subprocess.DEVNULL)
        wait_until(lambda: _answers(url), 10, "redis-server back with its AOF", poll_s=0.02)
        r = redis.Redis(port=port)
        assert got or r.llen("gpu1") == 1 or r.hlen("unacked") == 1, "the message is lost"
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def test_sends_and_restores_to_a_queues_exchange_reach_it_after_a_restart_without_persistence(tmp_path):
    """Mechanism B (../shared/repro/redis-loss/e4): kombu's binding set is gone after the restart."""
    proc, port = _server(tmp_path, persistent=False)
    url = f"redis://127.0.0.1:{port}/0"
    queue = kombu.Queue("gpu1", kombu.Exchange("gpu1", "direct"), "gpu1")
    try:
        with kombu.Connection(url) as conn:
            producer = kombu.Producer(conn.default_channel)
            producer.publish("before", exchange="gpu1", routing_key="gpu1", declare=[queue])
            proc.kill()
            proc.wait()
            proc = subprocess.Popen(server_argv(port, tmp_path), stdout=subprocess.DEVNULL)
            wait_until(lambda: _answers(url), 10, "redis-server restarted empty", poll_s=0.02)
            r = redis.Redis(port=port)
            assert not r.exists("_kombu.binding.gpu1")
            producer.publish("after", exchange="gpu1", routing_key="gpu1", declare=[queue], retry=True)
            assert r.llen("gpu1") == 1, "a send to the queue's exchange went nowhere"
            channel = conn.channel()
            message = queue(channel).get(no_ack=False)
            r.delete("_kombu.binding.gpu1")  # the worker's declaration made it again; a restart would not
            channel.qos.restore_by_tag(message.delivery_tag, leftmost=True)
            assert r.llen("gpu1") == 1 and not r.hlen("unacked"), "a restore to the queue's exchange went nowhere"
    finally:
        proc.kill()
        proc.wait()


def test_a_remote_control_consumer_whose_redis_restarts_is_told_the_connection_failed(tmp_path):
    """Celery's remote control (a fanout queue: kombu's pub/sub connection) across a quick Redis restart.

    The worker reads the closed socket only once Redis is back (its loop was busy, e.g. resending a
    heartbeat event). It must get a connection error, on which Celery restarts its consumer and
    subscribes again; redis-py's own retry connected anew without subscribing and read that connection
    forever, and the idle worker never took another task.
    """
    import threading

    from tasks import app

    proc, port = _server(tmp_path, persistent=True)
    url = f"redis://127.0.0.1:{port}/0"
    conn = app.connection_for_read(url)  # the worker's transport options (tasks.celery_app.configure)
    outcome: list[BaseException] = []
    try:
        queue = kombu.Queue("remote-control", kombu.Exchange("remote-control", "fanout"))
        kombu.Consumer(conn.default_channel, [queue], callbacks=[lambda body, m: None]).consume()
        for _ in range(3):  # subscribes, and reads Redis's confirmation
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.1)
        assert redis.Redis(port=port).pubsub_numpat() == 1
        proc.terminate()
        proc.wait()
        proc, _ = _server(tmp_path, persistent=True, port=port)

        def drain() -> None:
            try:
                conn.drain_events(timeout=5)
            except BaseException as exc:  # what the worker's event loop would raise to its consumer
                outcome.append(exc)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        reader.join(30)  # a hang, not a speed limit: the error comes at once
        assert not reader.is_alive(), "the consumer waits forever on a connection that subscribes to nothing"
        assert isinstance(outcome[0], conn.connection_errors), outcome
    finally:
        proc.kill()
        proc.wait()
        with contextlib.suppress(Exception):
            conn.release()


def test_a_consumer_takes_messages_by_priority_over_its_queues_each_in_unacked_until_acked(broker):
    """The worker's path: BRPOP on the queues' doorbells, then the pop script; the message is in ``unacked``
    (kombu's entry) while the task runs, gone once acked; a consumer that does not ack leaves no entry."""
    import json
    import time

    conn, _ = broker
    channel = conn.default_channel
    client = channel.client
    a, b, replies = (kombu.Queue(n, kombu.Exchange(n, "direct"), n) for n in ("a", "b", "replies"))
    producer = kombu.Producer(channel)
    producer.publish({"n": "a-low"}, exchange="a", routing_key="a", declare=[a], priority=7)
    producer.publish({"n": "b-high"}, exchange="b", routing_key="b", declare=[b], priority=0)
    producer.publish({"n": "reply"}, exchange="replies", routing_key="replies", declare=[replies])
    got: dict[str, tuple[object, bool]] = {}

    def take(body, message):  # what the task sees while it runs, then its ack
        info, tag = message.delivery_info, message.delivery_tag
        entry = client.hget(channel.unacked_key, tag)
        kombus = json.dumps([message._raw, info["exchange"], info["routing_key"]])  # kombu's QoS.append
        held = entry is not None and json.loads(entry) == json.loads(kombus)
        since = client.zscore(channel.unacked_index_key, tag)  # the delivery time: the visibility timeout's start
        assert held == (since is not None) and (since is None or abs(since - time.time()) < 600)
        if not message.acknowledged:
            message.ack()
        got[body["n"]] = (held, client.hexists(channel.unacked_key, tag))

    worker = kombu.Consumer(channel, [a, b], callbacks=[take])
    worker.qos(prefetch_count=1)
    worker.consume()
    kombu.Consumer(channel, [replies], callbacks=[take], no_ack=True).consume()  # as Celery's control replies
    for _ in range(3):
        conn.drain_events(timeout=5)
    assert got == {"b-high": (True, False), "a-low": (True, False), "reply": (False, False)}
    assert list(got).index("b-high") < list(got).index("a-low")
    assert not any(client.llen(q) for q in ("a", "b", "replies"))


def test_a_message_put_back_wakes_a_waiting_consumer_at_once_behind_those_waiting(broker):
    """A requeue (a task given back, or a restore) rings its queue's doorbell: a worker blocked on its doorbells
    takes the message now, not after its BRPOP times out (``polling_interval``: 30 s here), and after the
    messages already waiting, as kombu's own requeue puts it."""
    conn, proc = broker
    url = conn.as_uri(include_password=True)
    queue = kombu.Queue("q", kombu.Exchange("q", "direct"), "q")
    got: list[kombu.Message] = []
    with kombu.Connection(url, transport_options={"polling_interval": 30}) as waiting, _stopped_at_end(proc):
        producer = kombu.Producer(waiting.default_channel)
        for n in (1, 2):
            producer.publish({"n": n}, exchange="q", routing_key="q", declare=[queue])
        consumer = kombu.Consumer(waiting.default_channel, [queue], callbacks=[lambda body, m: got.append(m)])
        consumer.qos(prefetch_count=1)
        consumer.consume()
        waiting.drain_events(timeout=5)
        got.pop().reject(requeue=True)  # message 1, given back
        client = waiting.default_channel.client
        assert client.llen("q") == 2 and not client.hlen(waiting.default_channel.unacked_key)
        waiting.drain_events(timeout=5)  # message 2 (woken by its own ring)
        got.pop().ack()
        waiting.drain_events(timeout=5)  # socket.timeout without the requeue's ring
        assert got[0].payload == {"n": 1} and got[0].delivery_info["redelivered"]


def test_a_message_whose_ring_was_lost_is_taken_at_the_next_poll(broker):
    """Rings past BELL_MAX are dropped (a burst larger than that wakes a worker that many times): the messages
    beyond are found when the BRPOP times out (``polling_interval``, 1 s by default) and the pop runs anyway."""
    conn, _ = broker
    channel = conn.default_channel
    queue = kombu.Queue("q", kombu.Exchange("q", "direct"), "q")
    producer = kombu.Producer(channel)
    for n in range(transport.BELL_MAX + 3):
        producer.publish({"n": n}, exchange="q", routing_key="q", declare=[queue])
    assert channel.client.llen(transport.bell_key("q")) == transport.BELL_MAX
    channel.client.delete(transport.bell_key("q"))  # every ring lost
    got: list[int] = []
    kombu.Consumer(channel, [queue], callbacks=[lambda body, m: (got.append(body["n"]), m.ack())]).consume()
    while len(got) < 3:
        conn.drain_events(timeout=5)
    assert got == [0, 1, 2]


@pytest.mark.parametrize("end", ["ack", "reject"])
def test_a_message_ended_leaves_unacked_and_frees_its_slot_for_the_next(broker, end):
    conn, _ = broker
    channel, message = _delivered(conn)
    client = channel.client
    assert client.hlen(channel.unacked_key) == 1
    message.ack() if end == "ack" else message.reject(requeue=False)
    assert client.hlen(channel.unacked_key) == 0 and not client.zcard(channel.unacked_index_key)
    assert not client.llen("q")  # a rejected message is dropped, not requeued
    queue = kombu.Queue("q", routing_key="q")
    for n in (2, 3):  # the slot is free for good: each next message is taken once the one before has ended
        kombu.Producer(channel).publish({"n": n}, routing_key="q", declare=[queue])
        taken = queue(channel).get(no_ack=False)
        assert taken is not None and taken.payload == {"n": n} and not channel.qos.can_consume()
        taken.ack() if end == "ack" else taken.reject(requeue=False)
        assert channel.qos.can_consume()


def test_an_ack_while_redis_restarts_reaches_it_once_it_is_back(tmp_path, monkeypatch, caplog):
    """The removal is tried again (RETRY_DELAYS_S): a Redis back within them has the message acked there."""
    import threading

    monkeypatch.setattr(transport, "RETRY_DELAYS_S", (0.5, 1.0, 2.0))
    proc, port = _server(tmp_path, persistent=True)
    restarted: list[subprocess.Popen] = []
    try:
        with kombu.Connection(f"redis://127.0.0.1:{port}/0") as conn:
            channel, message = _delivered(conn)
            proc.terminate()
            proc.wait()
            back = threading.Timer(0.2, lambda: restarted.append(_server(tmp_path, persistent=True, port=port)[0]))
            back.start()
            message.ack()
            back.join()
            assert redis.Redis(port=port).hlen(channel.unacked_key) == 0
            assert "did not reach Redis" not in caplog.text
    finally:
        for server in (proc, *restarted):
            server.kill()
            server.wait()


def test_install_replaces_a_redis_transport_resolved_before_it(monkeypatch):
    from kombu import transport as kombu_transport
    from kombu.transport import redis as kombu_redis

    monkeypatch.setattr(kombu_transport, "TRANSPORT_ALIASES", {**kombu_transport.TRANSPORT_ALIASES})
    monkeypatch.setattr(kombu_transport, "_transport_cache", {})
    kombu_transport.TRANSPORT_ALIASES["redis"] = "kombu.transport.redis:Transport"
    assert kombu_transport.get_transport_cls("redis") is kombu_redis.Transport  # resolved, and cached, before
    transport.install()
    assert kombu_transport.get_transport_cls("redis") is transport.Transport
    assert kombu_transport.get_transport_cls("rediss") is transport.Transport
    assert kombu_transport.get_transport_cls("sentinel") is transport.SentinelTransport


@pytest.mark.parametrize("batch", [False, True], ids=["alone", "batch"])
def test_a_send_rings_its_queue_on_its_priority_list_with_the_queues_expiry_alone_or_in_a_batch(broker, batch):
    """Each message rings its queue in the same step as its LPUSH, on the list of its priority, and a queue declared
    with an expiry keeps it on every priority list; kombu's Producer.batch sends them all at its end."""
    conn, _ = broker
    channel = conn.default_channel
    client = channel.client
    queue = kombu.Queue("q", kombu.Exchange("q", "direct"), "q", expires=60)
    queue(channel).declare()
    producer = kombu.Producer(channel)
    plain = kombu.Queue("plain", kombu.Exchange("plain", "direct"), "plain")  # no expiry
    with producer.batch() if batch else contextlib.nullcontext():
        for n in range(3):
            producer.publish({"n": n}, exchange="q", routing_key="q", priority=n * 4)
        producer.publish({"n": 3}, exchange="plain", routing_key="plain", declare=[plain])
        assert client.llen(transport.bell_key("q")) == (0 if batch else 3)
    assert client.llen("plain") == 1 and client.pttl("plain") == -1 and client.llen(transport.bell_key("plain")) == 1
    keys = ["q", *(f"q{channel.sep}{p}" for p in (3, 6))]
    assert [client.llen(k) for k in keys] == [1, 1, 1] and client.llen(transport.bell_key("q")) == 3
    assert all(0 < client.pttl(k) <= 60_000 for k in keys)  # the queue's expiry (x-expires) on each list
    assert [queue(channel).get(no_ack=True).payload["n"] for _ in range(3)] == [0, 1, 2]


def test_a_worker_of_two_queues_takes_from_each_in_turn_at_one_priority(broker):
    """After a message of one queue the next poll asks the other first (kombu's round robin), so a busy queue
    does not starve the worker's other queue."""
    conn, _ = broker
    channel = conn.default_channel
    a, b = (kombu.Queue(n, kombu.Exchange(n, "direct"), n) for n in ("a", "b"))
    producer = kombu.Producer(channel)
    for _ in range(3):
        for queue in (a, b):
            producer.publish({"q": queue.name}, exchange=queue.name, routing_key=queue.name, declare=[queue])
    got: list[str] = []
    consumer = kombu.Consumer(channel, [a, b], callbacks=[lambda body, m: (got.append(body["q"]), m.ack())])
    consumer.qos(prefetch_count=1)
    consumer.consume()
    while len(got) < 6:
        conn.drain_events(timeout=5)
    assert all(x != y for x, y in zip(got, got[1:], strict=False)), got


def test_a_taken_message_is_written_into_unacked_by_the_pop_script_alone(broker):
    """The registration is one step with the pop: every write of the delivery into ``unacked`` is a command of
    the script (Redis's MONITOR names it ``lua``), none a client's own after it, so there is no moment when the
    message is in neither its queue nor ``unacked``."""
    import threading

    conn, _ = broker
    channel = conn.default_channel
    url = conn.as_uri(include_password=True)
    queue = kombu.Queue("q", kombu.Exchange("q", "direct"), "q")
    kombu.Producer(channel).publish({"n": 1}, exchange="q", routing_key="q", declare=[queue])
    seen: list[dict] = []
    with redis.Redis.from_url(url).monitor() as monitor:

        def record() -> None:
            for command in monitor.listen():
                seen.append(command)
                if command["command"].lower() == "echo end-of-test":
                    return

        reader = threading.Thread(target=record, daemon=True)
        reader.start()
        kombu.Consumer(channel, [queue], callbacks=[lambda body, m: None]).consume()
        conn.drain_events(timeout=5)
        redis.Redis.from_url(url).echo("end-of-test")
        reader.join(10)
    keys = {channel.unacked_key, channel.unacked_index_key}
    writes = [
        c for c in seen if c["command"].split()[0].upper() in ("HSET", "ZADD") and c["command"].split()[1] in keys
    ]
    assert len(writes) == 2 and all(c["client_type"] == "lua" for c in writes), writes

"""The broker transport: an ack that Redis refuses still frees the worker's prefetch slot.

A real redis-server, stopped between the delivery and the ack, and kombu's own channel.
"""

from __future__ import annotations

import subprocess

import kombu
import pytest
import redis

import tasks  # noqa: F401  (installs the transport)
from tasks.delivery import transport
from tasks.redis_client import free_port, server_argv
from tests.conftest import wait_until


@pytest.fixture
def broker(tmp_path):
    port = free_port()
    proc = subprocess.Popen(server_argv(port, tmp_path), stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    wait_until(lambda: _answers(url), 10, "the private redis-server", poll_s=0.02)
    with kombu.Connection(url) as conn:  # redis:// resolves to tasks.delivery.transport (installed by `import tasks`)
        yield conn, proc
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


def test_an_ack_that_reaches_redis_removes_the_message_from_unacked(broker):
    conn, _ = broker
    channel, message = _delivered(conn)
    client = channel.client
    assert client.hlen(channel.unacked_key) == 1
    message.ack()
    assert client.hlen(channel.unacked_key) == 0 and channel.qos.can_consume()


def test_redis_brokers_use_this_transport_and_still_read_redis_urls():
    from tasks import app

    conn = app.connection_for_read("redis://:secret@127.0.0.1:1/0")
    assert isinstance(conn.transport, transport.Transport)
    assert conn.as_uri() == "redis://:**@127.0.0.1:1/0"  # Flower's broker view and the banner read this
    assert not isinstance(app.connection_for_read("sentinel://127.0.0.1:1").transport, transport.Transport)

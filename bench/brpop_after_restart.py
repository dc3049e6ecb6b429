"""Reproduce, with kombu alone, a message lost by a consumer's first BRPOP after a Redis restart.

A consumer takes one message, Redis restarts while it works on it (a long task), a second message
is published, and the consumer goes back to the queue. With redis-py health checks on
(``health_check_interval`` > 0, and the connection idle longer than that) and a retry
(``retry_on_timeout``), the health check inside kombu's ``_brpop_start`` finds the BRPOP connection
dead, reconnects and sends the BRPOP on the new socket. The disconnect cleared ``Channel._in_poll``
and the poller's registration, so kombu neither reads the reply nor drains it when the channel
closes: the message is in no queue and not in ``unacked``. With either setting off, the BRPOP goes
to the dead socket or is never sent, the read fails, and the message stays queued.

    .venv/bin/python bench/brpop_after_restart.py   # three settings, one line each
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time

import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis(port: int, folder: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", folder, "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not answer")


def trial(health_check_interval_s: int, retry_on_timeout: bool) -> str:
    """Run the sequence once; say where the second message ended up."""
    port = _free_port()
    folder = tempfile.mkdtemp()
    server = _redis(port, folder)
    url = f"redis://127.0.0.1:{port}/0"
    queue = Queue("q", Exchange("q", "direct"), "q")
    # retry_on_timeout gives redis-py's connections one retry (redis/connection.py:896-902): the health
    # check's failed PING is retried on a new socket instead of raising.
    options = {"health_check_interval": health_check_interval_s, "retry_on_timeout": retry_on_timeout}
    got: list[str] = []
    consumer_conn = Connection(url, transport_options=options)
    consumer = Consumer(consumer_conn.default_channel, [queue], callbacks=[lambda body, m: (got.append(body), m.ack())])
    consumer.qos(prefetch_count=1)
    consumer.consume()
    with Connection(url) as conn:
        Producer(conn).publish("first", exchange=queue.exchange, routing_key="q", declare=[queue])
    consumer_conn.drain_events(timeout=5)  # the "task": its reply read, no BRPOP in flight now
    server.terminate()
    server.wait()
    server = _redis(port, folder)  # an empty Redis: only what follows is in it
    time.sleep(health_check_interval_s + 1)  # the task runs on past the health check interval
    with Connection(url) as conn:
        Producer(conn).publish("second", exchange=queue.exchange, routing_key="q", declare=[queue])
    try:
        consumer_conn.drain_events(timeout=2)
    except Exception as exc:  # a connection error (Celery would reconnect) or the timeout
        seen = f"{type(exc).__name__} {exc}".strip()
    else:
        seen = "a message"
    consumer_conn.close()  # what Celery's consumer restart does next
    check = redis.Redis(port=port)
    where = (
        "received"
        if "second" in got
        else "queued"
        if check.llen("q")
        else "unacked"
        if check.hlen("unacked")
        else "LOST"
    )
    server.terminate()
    server.wait()
    return f"drain_events gave {seen}; the second message is {where}"


if __name__ == "__main__":
    for interval, retry in ((10, True), (0, True), (10, False)):
        print(f"health_check_interval={interval} retry_on_timeout={retry}: {trial(interval, retry)}", flush=True)

"""Which closed socket a consumer busy across a quick Redis restart reads first: its BRPOP or its pub/sub one.

A kombu consumer with the worker's transport options consumes a task queue (BRPOP) and a fanout
queue (pub/sub, as Celery's remote control) on one connection. The first message's callback acks it
and restarts Redis (a task running while Redis restarts); then the consumer drains on. Each trial
prints how the drain ended: the error and the kombu function it came through (``_brpop_read``: the
BRPOP socket was read first; ``_receive_one``: the pub/sub one), or HUNG.

    .venv/bin/python bench/busy_consumer_restart.py --trials 6
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import kombu
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks import app  # noqa: E402  (installs the transport)
from tasks.redis_client import free_port, server_argv  # noqa: E402

READERS = ("_receive_one", "_brpop_read", "_brpop_start")


def start(port: int, folder: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(server_argv(port, folder, persistent=True), stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(400):
        with contextlib.suppress(redis.ConnectionError):
            client.ping()
            return proc
        time.sleep(0.005)
    raise RuntimeError("redis-server did not answer")


def trial() -> str:
    folder = tempfile.mkdtemp(prefix="busy-restart-")
    port = free_port()
    server = [start(port, folder)]
    url = f"redis://127.0.0.1:{port}/0"
    conn = app.connection_for_read(url)

    def busy(body: object, message: kombu.Message) -> None:
        message.ack()
        server[0].terminate()
        server[0].wait()
        server[0] = start(port, folder)
        time.sleep(0.2)

    try:
        task_queue = kombu.Queue("cpu", kombu.Exchange("cpu", "direct"), "cpu")
        kombu.Consumer(conn.default_channel, [task_queue], callbacks=[busy]).consume()
        control = kombu.Queue("control", kombu.Exchange("control", "fanout"))
        kombu.Consumer(conn.channel(), [control], callbacks=[lambda body, message: None]).consume()
        for _ in range(3):
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.1)
        with app.connection_for_write(url) as sender:
            kombu.Producer(sender).publish("task", exchange="cpu", routing_key="cpu")
        outcome: list[str] = []

        def drain() -> None:
            try:
                for _ in range(6):
                    with contextlib.suppress(TimeoutError):
                        conn.drain_events(timeout=1)
                outcome.append("no error")
            except Exception as exc:
                via = [f.name for f in traceback.extract_tb(exc.__traceback__) if f.name in READERS]
                outcome.append(f"{type(exc).__name__} via {'/'.join(via) or '?'}")

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        reader.join(15)
        return outcome[0] if outcome else "HUNG"
    finally:
        server[0].kill()
        server[0].wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args()
    for n in range(1, args.trials + 1):
        print(f"trial {n}: {trial()}", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What waiting for a replica costs one delivery: asynchronous replication, ``min-replicas-to-write``, and ``WAIT``.

    python bench/replica_wait_cost.py [--messages 400] [--rounds 4]

A private primary and one replica (``--replicaof``) on loopback. Each round sends ``--messages`` messages one at a
time through a consumer of tasks.delivery.transport (publish, the doorbell, the pop script, the ack) and times each
from its publish to its ack, in three configurations in turn:

- ``async``: the primary answers before the replica has the write (what framefleet does now);
- ``min-replicas-to-write 1``: the primary refuses writes while no replica has answered within 10 s (a primary cut
  off from its replicas stops taking writes instead of acknowledging ones a failover loses); no wait per write;
- ``WAIT 1`` after the send, the pop and the ack: each returns only once the replica has it (what a failover could
  then not lose, one more round trip and the replica's lag each).

Prints the median and p90 per delivery in microseconds, per configuration, and the ratio to ``async``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import tasks.celery_app  # noqa: E402, F401  (installs the transport)
from bench.delivery_cost import deliveries, print_table  # noqa: E402
from tasks.delivery import transport  # noqa: E402
from tasks.redis_client import free_port, server_argv  # noqa: E402

WAIT_TIMEOUT_MS = 1000


class WaitQoS(transport.QoS):
    def ack(self, delivery_tag: Any) -> None:
        super().ack(delivery_tag)
        _wait(self.channel)


class WaitChannel(transport.Channel):
    """The transport's channel, then ``WAIT 1`` after each send, pop and ack."""

    QoS = WaitQoS

    def _pop(self, lists: list[str], acks: bool | None = None) -> tuple[str, Any] | None:
        popped = super()._pop(lists, acks)
        if popped is not None:
            _wait(self)
        return popped

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        super()._put(queue, message, **kwargs)
        _wait(self)


def _wait(channel: Any) -> None:
    with channel.conn_or_acquire() as client:
        if client.execute_command("WAIT", 1, WAIT_TIMEOUT_MS) < 1:
            raise RuntimeError("the replica did not acknowledge within WAIT's timeout")


class WaitTransport(transport.Transport):
    Channel = WaitChannel


@contextmanager
def primary_and_replica() -> Iterator[tuple[str, redis.Redis]]:
    """A primary and a replica of it; yields the primary's URL and a client of it."""
    folder = Path(tempfile.mkdtemp(prefix="ff-bench-replica-"))
    ports = [free_port(), free_port()]
    procs = []
    try:
        for i, port in enumerate(ports):
            (folder / str(port)).mkdir()
            argv = server_argv(port, folder / str(port))
            argv += ["--replicaof", "127.0.0.1", str(ports[0])] if i else []
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
        replica = redis.Redis(port=ports[1])
        for _ in range(400):
            try:
                if replica.info("replication").get("master_link_status") == "up":
                    break
            except redis.ConnectionError:
                pass
            time.sleep(0.025)
        else:
            raise RuntimeError("the replica did not sync")
        yield f"redis://127.0.0.1:{ports[0]}/0", redis.Redis(port=ports[0])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    ours, waiting = "tasks.delivery.transport:Transport", f"{__name__}:WaitTransport"
    systems = {"async": (ours, 0), "min-replicas-to-write 1": (ours, 1), "WAIT 1": (waiting, 0)}
    spent: dict[str, list[float]] = {name: [] for name in systems}
    with primary_and_replica() as (url, primary):
        for cls, _ in systems.values():  # warm-up: connections, scripts loaded
            deliveries(url, cls, 20)
        for r in range(args.rounds):
            for name in list(systems)[r % 3 :] + list(systems)[: r % 3]:
                cls, min_replicas = systems[name]
                primary.config_set("min-replicas-to-write", min_replicas)
                primary.config_set("min-replicas-max-lag", 10)
                spent[name] += deliveries(url, cls, args.messages)
    print_table(spent, "replication", "async", args.rounds, args.messages)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What one delivery costs with kombu's Redis transport and with tasks.delivery.transport's atomic one, in turns.

    python bench/delivery_cost.py [--messages 400] [--rounds 4]

Against one private redis-server, each round sends ``--messages`` messages one at a time through a
consumer of each transport in turn (publish, the consumer's blocking wait and take, the ack) and
times each message from its publish to its ack. kombu's takes it with BRPOP and registers it in
``unacked`` afterwards; tasks.delivery.transport rings a doorbell with the LPUSH, the consumer BRPOPs the
doorbell and one Lua script pops the message and registers it. Prints the median and p90 per
delivery in microseconds, per transport, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modes_queue import private_redis  # noqa: E402


def deliveries(url: str, transport: str, messages: int) -> list[float]:
    """Microseconds from each publish to its ack, ``messages`` times, on ``transport``."""
    import kombu

    from tasks.delivery import queues

    options = queues.transport_options()
    spent: list[float] = []
    with kombu.Connection(url, transport=transport, transport_options=options) as conn:
        queue = kombu.Queue(f"bench-{transport.rsplit(':', 1)[-1]}", routing_key="bench")
        channel = conn.channel()
        producer = kombu.Producer(conn.channel())
        got: list[kombu.Message] = []
        consumer = kombu.Consumer(channel, [queue], callbacks=[lambda body, m: got.append(m)])
        consumer.qos(prefetch_count=1)
        consumer.consume()
        for i in range(messages):
            began = time.perf_counter()
            producer.publish({"n": i}, routing_key=queue.name, declare=[queue] if not i else None, priority=i % 3)
            while not got:
                conn.drain_events(timeout=5)
            got.pop().ack()
            spent.append((time.perf_counter() - began) * 1e6)
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    systems = {
        "kombu 5.7.0": "kombu.transport.redis:Transport",
        "tasks.delivery.transport": "tasks.delivery.transport:Transport",
    }
    spent: dict[str, list[float]] = {name: [] for name in systems}
    with private_redis() as url:
        for transport in systems.values():  # warm-up: connections, scripts loaded
            deliveries(url, transport, 20)
        for r in range(args.rounds):
            for name in list(systems)[r % 2 :] + list(systems)[: r % 2]:
                spent[name] += deliveries(url, systems[name], args.messages)
    print_table(spent, "transport", "kombu 5.7.0", args.rounds, args.messages)
    return 0


def print_table(spent: dict[str, list[float]], what: str, base: str, rounds: int, messages: int) -> None:
    """The median and p90 µs a delivery of each of ``spent``, and the ratio of its median to ``base``'s."""
    base_median = statistics.median(spent[base])
    print(f"{rounds} rounds × {messages} deliveries each, in turns; load {os.getloadavg()[0]:.1f}")
    print(f"{what:<26}{'n':>6}{'median µs':>11}{'p90 µs':>9}{'÷ ' + base.split()[0]:>9}")
    for name, values in spent.items():
        values.sort()
        median, p90 = statistics.median(values), values[int(0.9 * (len(values) - 1))]
        print(f"{name:<26}{len(values):>6}{median:>11.0f}{p90:>9.0f}{median / base_median:>9.2f}")


if __name__ == "__main__":
    sys.exit(main())

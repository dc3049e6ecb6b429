#!/usr/bin/env python3
"""What ordering a queue by stage costs on Redis: priority lists in one queue against a queue per stage.

    python bench/priority_cost.py [--messages N] [--rounds R]

Through kombu's Redis transport, the way a Celery worker consumes (a Consumer, prefetch 1, an ack
per message), against a private redis-server, for messages of 5 stages sent in a mixed order:
``fifo`` (one queue, one list: the order before), ``priority`` (one queue, a list per priority
0-9, the stage's priority on each message: what framefleet does), ``per-stage`` (a queue per
stage, consumed in stage order with ``queue_order_strategy: priority``). It reports the
microseconds per publish and per consume, the Redis commands per consumed message, the
microseconds of Redis's own CPU per consumed message (INFO commandstats), the
microseconds to read the length of a GPU's queue(s), and whether the consume order put later
stages first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modes_queue import private_redis  # noqa: E402

STAGES = ["preprocess", "depth", "tracks", "hands", "h5"]


def layout(mode: str) -> tuple[dict[str, Any], list[str]]:
    """(transport options, queue names consumed in order) of a mode."""
    if mode == "fifo":
        return {}, ["gpu0"]
    if mode == "priority":
        return {"priority_steps": list(range(10)), "sep": "\x06\x16"}, ["gpu0"]
    # A queue per stage, later stages first; one list each.
    return {"priority_steps": [0], "queue_order_strategy": "priority"}, [f"gpu0.{s}" for s in reversed(STAGES)]


def one(url: str, mode: str, n: int) -> dict[str, Any]:
    import redis
    from kombu import Connection, Consumer, Exchange, Producer, Queue

    options, names = layout(mode)
    r = redis.Redis.from_url(url)
    r.flushdb()
    exchange = Exchange("gpu0", type="direct")
    queues = [Queue(q, exchange, routing_key=q) for q in names]
    body = {"job": {"video_id": "x" * 24, "chain": STAGES, "timings": {}}, "pad": "p" * 1500}  # a job's size
    with Connection(url, transport_options=options) as conn:
        channel = conn.channel()
        for q in queues:
            q(channel).declare()
        producer = Producer(channel, exchange)
        began = time.perf_counter()
        for i in range(n):
            stage = STAGES[(i * 7) % len(STAGES)]  # mixed order
            key = names[0] if mode != "per-stage" else f"gpu0.{stage}"
            priority = len(STAGES) - 1 - STAGES.index(stage) if mode == "priority" else None
            producer.publish({**body, "stage": stage}, routing_key=key, priority=priority, serializer="json")
        publish_us = (time.perf_counter() - began) / n * 1e6

        lengths_began = time.perf_counter()
        for _ in range(200):
            pipe = r.pipeline(transaction=False)
            for q in names:
                for step in options.get("priority_steps", [0]):
                    pipe.llen(q if not step else f"{q}\x06\x16{step}")
            assert sum(pipe.execute()) == n
        length_us = (time.perf_counter() - lengths_began) / 200 * 1e6

        order: list[str] = []
        r.config_resetstat()
        calls_before = int(r.info("stats")["total_commands_processed"])

        def on_message(payload: dict[str, Any], message: Any) -> None:
            order.append(payload["stage"])
            message.ack()

        consumer = Consumer(channel, queues, callbacks=[on_message], accept=["json"])
        consumer.qos(prefetch_count=1)
        began = time.perf_counter()
        with consumer:
            while len(order) < n:
                conn.drain_events(timeout=5)
        consume_us = (time.perf_counter() - began) / n * 1e6
        commands = (int(r.info("stats")["total_commands_processed"]) - calls_before) / n
        # Redis's own CPU for the consuming commands: steadier than client timings on a loaded host.
        stats = r.info("commandstats")
        server_us = sum(v["usec"] for k, v in stats.items() if k != "cmdstat_info") / n
    ranks = [STAGES.index(s) for s in order]
    return {
        "mode": mode,
        "publish_us": publish_us,
        "consume_us": consume_us,
        "redis_commands_per_message": commands,
        "redis_server_us_per_message": server_us,
        "queue_length_us": length_us,
        "later_stages_first": ranks == sorted(ranks, reverse=True),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    modes = ["fifo", "priority", "per-stage"]
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with private_redis() as url:
        for i in range(args.rounds):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                results[mode].append(one(url, mode, args.messages))
    for mode, runs in results.items():
        summary = {
            k: statistics.median(r[k] for r in runs)
            for k in (
                "publish_us",
                "consume_us",
                "redis_commands_per_message",
                "redis_server_us_per_message",
                "queue_length_us",
            )
        }
        summary["later_stages_first"] = all(r["later_stages_first"] for r in runs)
        print(json.dumps({"mode": mode, **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

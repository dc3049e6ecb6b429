#!/usr/bin/env python3
"""What each Redis call of a stage transition costs: framefleet's per-task calls, timed one by one.

    python bench/transitions.py [--repeat 300]

Against a private redis-server on this machine, each call that ``tasks.pipeline.run_stage`` makes
around a stage (claim check, claim, attempt counter, release, done mark, progress, metrics, the
first progress event's state write) is run ``--repeat`` times; prints the median and p90 in
microseconds and one Redis round trip (PING) for scale. The same calls batched into one pipeline
are timed too: what merging them would save.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modes_queue import private_redis  # noqa: E402


def timed(fn: Callable[[int], object], repeat: int) -> tuple[float, float]:
    """Median and p90 of ``fn(i)`` in microseconds."""
    spent = []
    for i in range(repeat):
        t = time.perf_counter()
        fn(i)
        spent.append((time.perf_counter() - t) * 1e6)
    spent.sort()
    return statistics.median(spent), spent[int(0.9 * (len(spent) - 1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args(argv)
    with private_redis() as url:
        os.environ["REDIS_URL"] = url
        from tasks.delivery import claims
        from tasks.job import Job, StageTiming
        from tasks.observe import metrics, progress
        from tasks.redis_client import get_redis

        r = get_redis(url)
        job = Job("bench", "v", gpu=0, timings={"depth": StageTiming(1.0, 2.0, "w", False, 0.9)})
        key = claims.claim_key("/out", "v", "depth")
        ttl = 30 * 24 * 3600
        calls: dict[str, Callable[[int], object]] = {
            "PING (one round trip)": lambda i: r.ping(),
            "claims.is_done (SISMEMBER)": lambda i: claims.is_done(r, "bench", f"t{i}"),
            "claims.acquire (SET NX PX)": lambda i: claims.acquire(r, f"{key}{i}", "w t", 30),
            "start counter (HINCRBY+EXPIRE pipeline)": lambda i: (
                r.pipeline().hincrby("ff:run:bench:attempts", f"t{i}", 1).expire("ff:run:bench:attempts", ttl).execute()
            ),
            "claims.release (EVAL)": lambda i: claims.release(r, f"{key}{i}"),
            "claims.mark_done (SADD, EXPIRE, HDEL)": lambda i: claims.mark_done(r, "bench", f"t{i}", ttl),
            "progress.record (pipeline)": lambda i: progress.record(r, "bench", "depth", True, ttl),
            "metrics.record_stage (pipeline)": lambda i: metrics.record_stage(url, "depth", job),
            "task state PROGRESS (SET + PUBLISH)": lambda i: (
                r.pipeline()
                .set(f"celery-task-meta-t{i}", "x" * 300)
                .publish(f"celery-task-meta-t{i}", "x" * 300)
                .execute()
            ),
        }

        def batched(i: int) -> None:
            pipe = r.pipeline(transaction=False)
            pipe.sismember("ff:run:bench:done:0", i)
            pipe.set(f"{key}b{i}", "w t", nx=True, px=30000)
            pipe.hincrby("ff:run:bench:attempts", f"b{i}", 1)
            pipe.expire("ff:run:bench:attempts", ttl)
            pipe.execute()
            pipe = r.pipeline(transaction=False)
            pipe.delete(f"{key}b{i}")
            pipe.sadd("ff:run:bench:done:0", i)
            pipe.expire("ff:run:bench:done:0", ttl)
            pipe.hdel("ff:run:bench:attempts", f"b{i}")
            pipe.hincrby("ff:run:bench", "depth.done", 1)
            pipe.expire("ff:run:bench", ttl)
            pipe.rpush(metrics.stage_log_key("bench"), "{}")
            pipe.hincrby(metrics.COUNTS_KEY, "stage|depth|done", 1)
            pipe.execute()

        calls["all of the above in 2 pipelines"] = batched
        print(f"{'call':<40}{'median µs':>11}{'p90 µs':>10}   (load {os.getloadavg()[0]:.1f})")
        total = 0.0
        for name, fn in calls.items():
            fn(-1)  # warm: connection, script cache
            med, p90 = timed(fn, args.repeat)
            if name not in ("PING (one round trip)", "all of the above in 2 pipelines"):
                total += med
            print(f"{name:<40}{med:>11.0f}{p90:>10.0f}")
        print(f"{'sum of the separate calls':<40}{total:>11.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

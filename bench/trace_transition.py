#!/usr/bin/env python3
"""Where a stage transition's time goes: framefleet's chain, one video at a time, every step timestamped.

    python bench/trace_transition.py RAW_DIR [--videos 10] [--cpu-pool prefork|solo] [--work DIR]

Starts a private redis-server, a ``gpu0`` solo worker and a ``cpu`` worker (as bench/compare.py's
``ff-1by1`` mode does, prefork 2 unless ``--cpu-pool solo``), each with ``--include bench.trace_hooks``,
runs the videos' chains one after another (the first warms up and is not counted) and prints, for
every event between the end of one stage's work and the start of the next (the span
bench/compare.py counts as a transition), its median offset from that end and its median duration (ms).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modes_queue import _wait_registered, private_redis, processes  # noqa: E402

# The benchmarks measure the orchestration with the synthetic stand-ins, as their recorded results did.
os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")


def run(raw_dir: Path, out_dir: Path, videos: int, cpu_pool: str, trace_dir: Path) -> list[list[str]]:
    """Run the chains; return each counted video's task ids in chain order."""
    with private_redis() as url:
        os.environ["REDIS_URL"] = url  # before tasks is imported: the settings read it once
        from celery import chain

        from bench.modes_local import jobs_for
        from tasks.autoscaler.supervisor import worker_argv
        from tasks.pipeline import STAGE_TASKS

        env = {**os.environ, "REDIS_URL": url, "FF_TRACE_DIR": str(trace_dir)}
        include = ["--include", "bench.trace_hooks"]
        with processes(out_dir / "logs") as start:
            start("gpu0", [*worker_argv("gpu0", "gpu0"), *include], env)
            concurrency = 2 if cpu_pool == "prefork" else 1
            start("cpu", [*worker_argv("cpu", "cpu", cpu_pool, concurrency), *include], env)
            _wait_registered(url, ["gpu0", "cpu"])
            chains = []
            for i, job in enumerate(jobs_for(raw_dir, out_dir, videos + 1)):
                result = chain(
                    *(STAGE_TASKS[s].s(job) if not k else STAGE_TASKS[s].s() for k, s in enumerate(job["chain"]))
                ).apply_async()
                result.get(timeout=300, propagate=True)
                ids = []
                node = result
                while node is not None:
                    ids.append(node.id)
                    node = node.parent
                if i:
                    chains.append(list(reversed(ids)))
        return chains


def load(trace_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in trace_dir.glob("*.jsonl"):
        events += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(events, key=lambda e: e["t"])


def breakdown(events: list[dict[str, Any]], chains: list[list[str]]) -> dict[str, dict[str, list[float]]]:
    """Per event name: offsets (ms) from the end of the previous stage's work, and durations (ms)."""
    ends = {e["id"]: e["t"] + e["ms"] / 1000 for e in events if e["ev"] == "_execute"}
    starts = {e["id"]: e["t"] + e["ms"] / 1000 for e in events if e["ev"] == "_claim_or_wait"}
    rows: dict[str, dict[str, list[float]]] = {}
    for ids in chains:
        for a, b in zip(ids, ids[1:], strict=False):
            if a not in ends or b not in starts:
                continue
            t0, t1 = ends[a], starts[b]
            rows.setdefault("= transition", {"at": [], "ms": []})["ms"].append((t1 - t0) * 1000)
            rows["= transition"]["at"].append(0.0)
            for e in events:
                if t0 <= e["t"] <= t1 and e["id"] in (a, b, None):
                    who = "A" if e["id"] == a else "B" if e["id"] == b else "?"
                    row = rows.setdefault(f"{who} {e['ev']}", {"at": [], "ms": []})
                    row["at"].append((e["t"] - t0) * 1000)
                    row["ms"].append(e["ms"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw_dir", type=Path)
    parser.add_argument("--videos", type=int, default=10)
    parser.add_argument("--cpu-pool", choices=("prefork", "solo"), default="prefork")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="ff-trace-"))
    trace_dir = work / "trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    chains = run(args.raw_dir, work / "out", args.videos, args.cpu_pool, trace_dir)
    rows = breakdown(load(trace_dir), chains)
    print(f"{len(chains)} videos; events inside a transition (A: the finishing task, B: the next one)")
    print(f"{'event':<34}{'n':>5}{'at median ms':>14}{'took median ms':>16}")
    for name, row in sorted(rows.items(), key=lambda kv: statistics.median(kv[1]["at"])):
        print(
            f"{name:<34}{len(row['ms']):>5}{statistics.median(row['at']):>14.2f}{statistics.median(row['ms']):>16.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A stage transition of two framefleet checkouts and of the raw Celery chain, measured in turns.

    python bench/transition_interleaved.py RAW_DIR --base BASE_TREE [--videos 30] [--work DIR]

bench/compare.py measures one mode after the other, a minute apart; on a shared machine the load
moves more than the difference. Here three idle clusters run side by side, each with its own
redis-server: framefleet from BASE_TREE (a checkout of the base commit with this bench/ copied
in), framefleet from this tree, and the raw chain of bench/rawchain.py. One video's chain runs at a
time, the three take turns (rotating who goes first), so a load from elsewhere falls on all three
alike. Prints each one's median and p90 transition (the end of one stage's work to the start of
the next's, as bench/compare.py counts it) and the ratios to the raw chain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# The benchmarks measure the orchestration with the synthetic stand-ins, as their recorded results did.
os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child_framefleet(raw_dir: Path, out_dir: Path, videos: int) -> None:
    """Serve turns: on each line of stdin, run one video's chain and print its spans as one JSON line."""
    from bench.modes_queue import _wait_registered, private_redis, processes

    with private_redis() as url:
        os.environ["REDIS_URL"] = url
        from celery import chain

        from bench.modes_local import jobs_for
        from tasks.autoscaler.supervisor import worker_argv
        from tasks.pipeline import STAGE_TASKS

        env = {**os.environ, "REDIS_URL": url}
        with processes(out_dir / "logs") as start:
            start("gpu0", worker_argv("gpu0", "gpu0"), env)
            start("cpu", worker_argv("cpu", "cpu"), env)
            _wait_registered(url, ["gpu0", "cpu"])
            jobs = jobs_for(raw_dir, out_dir, None)
            print("ready", flush=True)
            for i in range(videos):
                if not sys.stdin.readline():
                    break
                job = {**jobs[i % len(jobs)], "video_id": f"{jobs[i % len(jobs)]['video_id']}-{i}"}
                result = chain(
                    *(STAGE_TASKS[s].s(job) if not k else STAGE_TASKS[s].s() for k, s in enumerate(job["chain"]))
                ).apply_async()
                final = result.get(timeout=300, propagate=True)
                spans = [{"video": str(i), "stage": s, **t} for s, t in final["timings"].items()]
                print(json.dumps(spans), flush=True)


def child_raw(videos: int) -> None:
    """Serve turns with the raw chain of no-op tasks."""
    from bench.modes_queue import private_redis, processes

    with private_redis() as url:
        os.environ["REDIS_URL"] = url
        from bench import rawchain

        rawchain.app.conf.update(broker_url=url, result_backend=url)
        env = {**os.environ, "REDIS_URL": url}
        with processes(Path(tempfile.mkdtemp(prefix="ff-raw-"))) as start:
            for queue in ("raw.cpu", "raw.gpu0"):
                argv = [sys.executable, "-m", "celery", "-A", "bench.rawchain", "worker", "-Q", queue, "-P", "solo"]
                start(queue, [*argv, "-n", f"{queue}@%h", "-E", "--without-gossip", "--without-mingle"], env)
            while len(rawchain.app.control.ping(timeout=0.5)) < 2:
                pass
            print("ready", flush=True)
            for i in range(videos):
                if not sys.stdin.readline():
                    break
                steps = rawchain.chain_of().apply_async().get(timeout=60)
                print(json.dumps([{"video": str(i), **s} for s in steps]), flush=True)


def gaps_ms(spans: list[dict[str, Any]]) -> list[float]:
    ordered = sorted(spans, key=lambda s: s["start"])
    return [(b["start"] - a["end"]) * 1000 for a, b in zip(ordered, ordered[1:], strict=False)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw_dir", type=Path)
    parser.add_argument("--base", type=Path, required=True, help="a checkout of the base commit")
    parser.add_argument("--videos", type=int, default=30, help="chains per system (the first warms up)")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--child", choices=("framefleet", "raw"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "framefleet":
        child_framefleet(args.raw_dir, args.out, args.videos)
        return 0
    if args.child == "raw":
        child_raw(args.videos)
        return 0

    work = args.work or Path(tempfile.mkdtemp(prefix="ff-interleaved-"))
    systems = {"framefleet before": args.base.resolve(), "framefleet after": ROOT, "raw chain": ROOT}
    children: dict[str, subprocess.Popen[str]] = {}
    for name, tree in systems.items():
        kind = "raw" if name == "raw chain" else "framefleet"
        out = work / name.replace(" ", "-")
        argv = [sys.executable, "bench/transition_interleaved.py", str(args.raw_dir.resolve()), "--base", str(tree)]
        argv += ["--videos", str(args.videos), "--child", kind, "--out", str(out)]
        env = {**os.environ, "PYTHONPATH": str(tree), "FRAMEFLEET_TORCH_THREADS": "1"}
        (work / "logs").mkdir(parents=True, exist_ok=True)
        stderr = open(work / "logs" / f"{name.replace(' ', '-')}.err", "w")
        children[name] = subprocess.Popen(
            argv, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    try:
        for name, proc in children.items():
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{name} did not start; see {work / 'logs'}")
        names = list(children)
        gaps: dict[str, list[float]] = {name: [] for name in names}
        loads = []
        for i in range(args.videos):
            loads.append(os.getloadavg()[0])
            order = names[i % 3 :] + names[: i % 3]
            for name in order:
                proc = children[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                spans = json.loads(proc.stdout.readline())
                if i:  # the first chain of each warms it up
                    gaps[name] += gaps_ms(spans)
    finally:
        for proc in children.values():
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in children.values():
            proc.wait(timeout=120)
    raw = statistics.median(gaps["raw chain"])
    print(f"{args.videos - 1} chains each, in turns; 1-minute load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'system':<20}{'n':>5}{'median ms':>11}{'p90 ms':>9}{'median / raw':>14}")
    for name in names:
        median = statistics.median(gaps[name])
        print(f"{name:<20}{len(gaps[name]):>5}{median:>11.1f}{pct(gaps[name], 0.9):>9.1f}{median / raw:>14.2f}")
    (work / "gaps.json").write_text(json.dumps(gaps))
    return 0


if __name__ == "__main__":
    sys.exit(main())

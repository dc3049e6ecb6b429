#!/usr/bin/env python3
"""What the orchestration costs: framefleet against a plain loop, the predecessor's pool and Ray Data.

    python bench/compare.py RAW_DIR [--work DIR] [--limit N] [--rounds R] [--modes a,b,...]

Every mode runs the same stage code (``tasks.pipeline._execute``) with the same settings on the
same videos, in its own process tree, measured from outside: wall seconds, CPU-seconds and peak
total RSS of every process of the tree (Redis and Ray's daemons included). Rounds alternate the
order of the modes (ABC, CBA, ...) so that a load from elsewhere on the machine falls on all.

Modes: ``sequential`` (one process, models loaded once); ``pool`` (the predecessor's pattern:
per stage, a process per slot loading its model, videos round-robin); ``framefleet``
(``scripts/run_local.py``); ``ff-split`` (run_local.py with a gpu0 stand-in and a cpu worker
per core, apart, as CPU mode was before one worker per core hosted both); ``ff-before``
(run_local.py as CPU mode was earlier still: one stand-in worker for gpu0, torch's default
threads); ``ff-1by1`` (framefleet's chain, one video at a time: its transitions
are dispatch alone); ``raw-chain`` (no-op Celery tasks routed cpu → gpu0 ×3 → cpu: the floor for
dispatch); ``ray-stages`` and ``ray-fused`` (Ray Data, one map per stage, or one fused map).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# The benchmarks measure the orchestration with the synthetic stand-ins, as their recorded results did.
os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("sequential", "pool", "framefleet", "ff-split", "ff-before", "ff-1by1", "raw-chain", "ray-stages", "ray-fused")
RESULT = "RESULT "


def child(mode: str, raw: Path, out: Path, limit: int | None, one_by_one: int, extra: list[str]) -> dict[str, Any]:
    """Run one mode in this process (the measured one); return its spans and inner wall time."""
    cores = os.cpu_count() or 1
    if mode in ("sequential", "pool", "ray-stages", "ray-fused"):
        from bench import modes_local

        jobs = modes_local.jobs_for(raw, out, limit)
        began = time.time()
        if mode == "sequential":
            return {"spans": modes_local.sequential(jobs), "run_wall_s": time.time() - began}
        if mode == "pool":
            return {"spans": modes_local.pool(jobs, cores), "run_wall_s": time.time() - began}
        from bench import modes_ray

        return modes_ray.run(jobs, mode == "ray-fused", cores)
    from bench import modes_queue

    if mode == "framefleet":
        return modes_queue.framefleet(raw, out, limit, extra)
    if mode == "ff-split":  # a gpu0 stand-in and a cpu worker per core (CPU mode before one worker hosted both)
        return modes_queue.framefleet(
            raw, out, limit, [*extra, "--gpu-workers", str(cores), "--cpu-workers", str(cores)]
        )
    if mode == "ff-before":  # CPU mode as it was: one stand-in for gpu0, torch's default threads
        os.environ.pop("FRAMEFLEET_TORCH_THREADS", None)
        return modes_queue.framefleet(raw, out, limit, [*extra, "--gpu-workers", "1"])
    if mode == "ff-1by1":
        return modes_queue.framefleet_one_by_one(raw, out, one_by_one)
    if mode == "raw-chain":
        return modes_queue.raw_chain(max(one_by_one, 20), limit or 40)
    raise SystemExit(f"unknown mode {mode!r}; modes are {', '.join(MODES)}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def transitions(spans: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per transition "a→b": each video's seconds from the end of stage a to the start of stage b."""
    by_video: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_video.setdefault(s["video"], []).append(s)
    gaps: dict[str, list[float]] = {}
    for steps in by_video.values():
        steps.sort(key=lambda s: s["start"])
        for prev, nxt in zip(steps, steps[1:], strict=False):
            gaps.setdefault(f"{prev['stage']}→{nxt['stage']}", []).append(nxt["start"] - prev["end"])
    return gaps


def summarise(mode: str, measured: Any, result: dict[str, Any], load: float) -> dict[str, Any]:
    spans = result["spans"]
    gaps = transitions(spans)
    every = [g for values in gaps.values() for g in values]
    per_stage: dict[str, dict[str, float]] = {}
    for s in spans:
        entry = per_stage.setdefault(s["stage"], {"tasks": 0, "model_s": 0.0, "stage_io_s": 0.0})
        entry["tasks"] += 1
        entry["model_s"] += s["run_s"]
        entry["stage_io_s"] += s["end"] - s["start"] - s["run_s"]
    return {
        "mode": mode,
        "ok": measured.returncode == 0,
        "wall_s": measured.wall_s,
        "cpu_s": measured.cpu_s,
        "peak_rss_mib": measured.peak_rss_mib,
        "processes": measured.peak_processes,
        "cpu_by_kind": measured.cpu_by_kind,
        "run_wall_s": result.get("run_wall_s"),
        "load_before": load,
        "gap_median_ms": 1000 * pct(every, 0.5),
        "gap_p90_ms": 1000 * pct(every, 0.9),
        "gaps_ms": {k: {"median": 1000 * pct(v, 0.5), "p90": 1000 * pct(v, 0.9), "n": len(v)} for k, v in gaps.items()},
        "stages": per_stage,
    }


def measure_mode(mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bench.proctree import measure

    out = work / f"out-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        str(args.raw_dir),
        "--child",
        mode,
        "--out",
        str(out),
        "--one-by-one",
        str(args.one_by_one),
        *(["--limit", str(args.limit)] if args.limit else []),
    ]
    if args.framefleet_args:
        argv += ["--framefleet-args", args.framefleet_args]
    load = os.getloadavg()[0]
    measured = measure(argv, dict(os.environ), ROOT, work / f"{mode}.log")
    lines = [line for line in measured.stdout.splitlines() if line.startswith(RESULT)]
    if measured.returncode or not lines:
        print(f"{mode}: failed (exit {measured.returncode}); see {work / (mode + '.log')}", file=sys.stderr)
        return {"mode": mode, "ok": False, "wall_s": measured.wall_s, "load_before": load}
    return summarise(mode, measured, json.loads(lines[-1][len(RESULT) :]), load)


def table(rows: list[dict[str, Any]]) -> str:
    """One line per mode: medians over the rounds, ratios to the sequential loop's medians."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("ok"):
            by_mode.setdefault(row["mode"], []).append(row)

    def med(mode: str, key: str) -> float:
        values = [r[key] for r in by_mode.get(mode, []) if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    seq_wall, seq_cpu = med("sequential", "wall_s"), med("sequential", "cpu_s")
    head = (
        f"{'mode':<12}{'runs':>5}{'wall s':>9}{'× seq':>7}{'inner s':>9}{'CPU s':>8}{'× seq':>7}"
        f"{'RSS MiB':>9}{'gap med ms':>12}{'gap p90 ms':>12}{'model s':>9}{'stage I/O s':>12}"
    )
    lines = [head]
    for mode in [m for m in MODES if m in by_mode]:
        stages = by_mode[mode][0]["stages"]
        model = sum(s["model_s"] for s in stages.values())
        io = sum(s["stage_io_s"] for s in stages.values())
        lines.append(
            f"{mode:<12}{len(by_mode[mode]):>5}{med(mode, 'wall_s'):>9.1f}{med(mode, 'wall_s') / seq_wall:>7.2f}"
            f"{med(mode, 'run_wall_s'):>9.1f}{med(mode, 'cpu_s'):>8.1f}{med(mode, 'cpu_s') / seq_cpu:>7.2f}"
            f"{med(mode, 'peak_rss_mib'):>9.0f}{med(mode, 'gap_median_ms'):>12.1f}{med(mode, 'gap_p90_ms'):>12.1f}"
            f"{model:>9.1f}{io:>12.1f}"
        )
    for mode in by_mode:
        kinds = by_mode[mode][0].get("cpu_by_kind") or {}
        if len(kinds) > 1:
            lines.append(f"\n{mode}: CPU-seconds by process (first round)")
            lines.extend(f"  {kind:<40}{cpu:>8.1f}" for kind, cpu in kinds.items() if cpu >= 0.05)
    for mode in ("ff-1by1", "raw-chain", "framefleet"):
        if mode in by_mode:
            lines.append(f"\n{mode}: transitions (median / p90 ms, first round)")
            for name, g in by_mode[mode][0]["gaps_ms"].items():
                lines.append(f"  {name:<24}{g['median']:>8.1f} /{g['p90']:>8.1f}   n={g['n']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw_dir", type=Path, metavar="RAW_DIR")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-compare"))
    parser.add_argument("--limit", type=int, help="only the first N videos")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--one-by-one", type=int, default=10, help="videos of the one-at-a-time modes")
    parser.add_argument("--framefleet-args", default="", help="extra arguments of run_local.py, one string")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    raw = args.raw_dir.resolve()
    if args.child:
        result = child(args.child, raw, args.out, args.limit, args.one_by_one, args.framefleet_args.split())
        print(RESULT + json.dumps(result), flush=True)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; modes are {', '.join(MODES)}")
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for round_ in range(args.rounds):
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            row = measure_mode(mode, args, args.work)
            rows.append({**row, "round": round_})
            print(
                f"round {round_} {mode}: wall {row['wall_s']:.1f} s, load before {row['load_before']:.2f}"
                + ("" if row.get("ok") else " FAILED"),
                file=sys.stderr,
                flush=True,
            )
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    print(f"{len(os.sched_getaffinity(0))} cores; videos: {args.limit or 'all'} of {raw}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Per-video latency (enqueue → HDF5) and peak intermediates on disk, for two code trees on the same videos.

    python bench/latency.py RAW_DIR --before TREE [--after TREE] [--before-env NAME=VALUE] [--work DIR]
                            [--limit N] [--rounds R] [-- RUN_ARGS...]

Each tree runs ``TREE/scripts/run_local.py RAW_DIR --out OUT --intermediates drop RUN_ARGS`` with
``PYTHONPATH=TREE`` against a private Redis; rounds alternate the order (AB, BA, ...) so that load
from elsewhere falls on both. While it runs, OUT/work is measured every 0.5 s (bytes, and videos
with a work folder). Afterwards the stage log gives, per video: latency = its HDF5 written minus
the run's start (when the chains were sent), and in flight = its HDF5 written minus its first
stage's start; and the waits between stages. With ``--intermediates drop`` a video's work folder
lives from its first stage to its HDF5, so the peak measures how many videos are under way at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modes_queue import private_redis, stage_log  # noqa: E402

# The benchmarks measure the orchestration with the synthetic stand-ins, as their recorded results did.
os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")

SAMPLE_EVERY_S = 0.5


class DiskSampler(threading.Thread):
    """Reads the size of a folder (bytes, and its subfolders) every ``SAMPLE_EVERY_S`` until stopped."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder = folder
        self.samples: list[tuple[float, int, int]] = []  # (epoch s, bytes, videos)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_EVERY_S):
            self.samples.append((time.time(), *folder_size(self.folder)))

    def stop(self) -> None:
        self.done.set()
        self.join()


def folder_size(folder: Path) -> tuple[int, int]:
    """(bytes in files under ``folder``, subfolders directly in it); files vanishing meanwhile are skipped."""
    total, videos = 0, 0
    for root, dirs, files in os.walk(folder):
        if root == str(folder):
            videos = len(dirs)
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total, videos


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def waits(spans: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Seconds between a video's stage ending and its next stage starting, per transition ``a→b``."""
    per_video: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        per_video.setdefault(s["video"], []).append(s)
    gaps: dict[str, list[float]] = {}
    for stages in per_video.values():
        stages.sort(key=lambda s: s["start"])
        for a, b in zip(stages, stages[1:], strict=False):
            gaps.setdefault(f"{a['stage']}→{b['stage']}", []).append(b["start"] - a["end"])
    return gaps


def run_tree(
    tree: Path, raw: Path, out: Path, limit: int | None, extra: list[str], more_env: dict[str, str]
) -> dict[str, Any]:
    """One run of ``tree``'s run_local.py (with ``more_env``); return latency, disk and wait figures."""
    shutil.rmtree(out, ignore_errors=True)
    with private_redis() as url:
        path = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))  # the GPU machine's Celery
        env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": path, **more_env}
        argv = [sys.executable, str(tree / "scripts" / "run_local.py"), str(raw), "--out", str(out)]
        argv += [*(["--limit", str(limit)] if limit else []), "--intermediates", "drop", *extra]
        sampler = DiskSampler(out / "work")
        sampler.start()
        began = time.time()
        done = subprocess.run(argv, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler.stop()
        if done.returncode:
            raise RuntimeError(f"{tree}: run_local.py failed ({done.returncode}):\n{done.stdout[-3000:]}")
        spans = stage_log(url)
    summary = json.loads((out / "run_summary.json").read_text())
    started = float(summary["started"])
    last = max(s["end"] for s in spans)
    h5_end = {s["video"]: s["end"] for s in spans if s["stage"] == "h5"}
    first_start = {v: min(s["start"] for s in spans if s["video"] == v) for v in h5_end}
    latency = [end - started for end in h5_end.values()]
    in_flight = [end - first_start[v] for v, end in h5_end.items()]
    gaps = waits(spans)
    return {
        "tree": str(tree),
        "videos": len(h5_end),
        "wall_s": time.time() - began,
        "run_wall_s": last - started,
        "latency_s": {"median": statistics.median(latency), "p90": quantile(latency, 0.9), "max": max(latency)},
        "in_flight_s": {"median": statistics.median(in_flight), "p90": quantile(in_flight, 0.9), "max": max(in_flight)},
        "first_hdf5_s": min(latency),
        "peak_work_mib": max((b for _, b, _ in sampler.samples), default=0) / 2**20,
        "peak_work_videos": max((v for _, _, v in sampler.samples), default=0),
        "mean_work_mib": statistics.fmean(b for _, b, _ in sampler.samples) / 2**20 if sampler.samples else 0.0,
        "waits_s": {k: {"mean": statistics.fmean(v), "median": statistics.median(v)} for k, v in sorted(gaps.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw_dir", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-latency"))
    parser.add_argument("--limit", type=int)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--before", type=Path, required=True, help="the code tree measured as the baseline")
    parser.add_argument("--after", type=Path, default=ROOT, help="the code tree measured against it (default: this)")
    parser.add_argument(
        "--before-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the baseline's runs, e.g. FRAMEFLEET_STAGE_PRIORITIES=false "
        "with --before . to compare one tree with its priorities off",
    )
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:split]), argv[split + 1 :]  # after --: more arguments for run_local.py
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    envs = {"before": dict(kv.split("=", 1) for kv in args.before_env), "after": {}}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for i in range(args.rounds):
        for name in list(trees) if i % 2 == 0 else list(trees)[::-1]:
            result = run_tree(trees[name], args.raw_dir, args.work / name, args.limit, extra, envs[name])
            results[name].append(result)
            print(f"round {i + 1} {name}: {json.dumps(result)}", flush=True)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

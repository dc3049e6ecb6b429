#!/usr/bin/env python3
"""The strict GPU busy measure: each GPU's NVML utilisation, sampled, over a run's window (enqueue to statistics).

    python bench/busy_share.py sample SAMPLES.csv [--period-s 0.25]      (until SIGTERM or SIGINT)
    python bench/busy_share.py report SAMPLES.csv RUN_SUMMARY.json --gpus 0,1 [--json OUT.json]

``sample`` appends "epoch, index, util %, used MiB" per GPU every ``--period-s`` seconds (4 Hz by default),
read through tasks.gpu.nvml (no CUDA context). ``report`` takes the window from the run's summary
(``started``, the run record written as the enqueue begins, to ``finished``, the statistics written) and
prints, per GPU, the busy share (busy seconds / window seconds, NVML's utilisation weighting each sample's
interval) and the idle seconds split into start (before the first busy sample), hand-offs (between the
first and last busy samples) and tail (after the last).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUSY_PCT = 50.0  # a sample at or above this utilisation is busy, for where the start ends and the tail begins


@dataclass(frozen=True)
class Busy:
    """One GPU over one window; seconds, and ``share`` = ``busy_s`` / ``window_s``."""

    gpu: int
    window_s: float
    busy_s: float
    share: float
    start_s: float
    handoffs_s: float
    tail_s: float
    samples: int
    hz: float


def busy(points: list[tuple[float, float]], start: float, end: float, gpu: int = 0) -> Busy:
    """The busy share of one GPU's ``points`` ((epoch s, util %), in time order) over ``[start, end]``.

    A sample's utilisation stands for the interval since the sample before it (NVML's reading is an average
    over its last period). Raises ValueError when the samples do not cover the window: the measure is then
    not strict.
    """
    if end <= start:
        raise ValueError(f"window [{start}, {end}] is empty: the run's summary needs started < finished")
    if len(points) < 2 or points[0][0] > start or points[-1][0] < end:
        seen = f"[{points[0][0]:.1f}, {points[-1][0]:.1f}]" if points else "no samples"
        raise ValueError(
            f"GPU {gpu}: samples {seen} do not cover the window [{start:.1f}, {end:.1f}]; start the sampler "
            "before the enqueue and stop it after the statistics"
        )
    first = next((t for t, u in points if start <= t and u >= BUSY_PCT), None)
    last = next((t for t, u in reversed(points) if t <= end and u >= BUSY_PCT), None)
    busy_s = idle_start = idle_tail = 0.0
    inside = 0
    for (t0, _), (t1, u) in zip(points, points[1:], strict=False):
        a, b = max(t0, start), min(t1, end)
        if b <= a:
            continue
        inside += 1
        busy_s += (b - a) * u / 100
        idle = (b - a) * (1 - u / 100)
        if first is None or b <= first:  # a sample stands for the interval ending at it
            idle_start += idle
        elif last is not None and a >= last:
            idle_tail += idle
    window = end - start
    idle_all = window - busy_s
    return Busy(
        gpu=gpu,
        window_s=round(window, 2),
        busy_s=round(busy_s, 2),
        share=round(busy_s / window, 4),
        start_s=round(idle_start, 2),
        handoffs_s=round(idle_all - idle_start - idle_tail, 2),
        tail_s=round(idle_tail, 2),
        samples=inside,
        hz=round(inside / window, 2),
    )


def read_samples(path: Path, gpu: int) -> list[tuple[float, float]]:
    """One GPU's (epoch, util %) from a samples file, in time order."""
    rows = [line.split(",") for line in path.read_text().splitlines() if line.count(",") == 3]
    return sorted((float(r[0]), float(r[2])) for r in rows if int(r[1]) == gpu)


def sample(out: Path, period_s: float) -> int:
    """Append every GPU's utilisation and memory to ``out`` every ``period_s`` until a signal."""
    sys.path.insert(0, str(ROOT))
    from tasks.gpu.nvml import NvmlProbe

    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: stop.append(signum))
    probe = NvmlProbe()
    try:
        with out.open("a") as f:
            tick = time.time()
            while not stop:
                now = time.time()
                for g in probe.gpus():
                    f.write(f"{now:.3f}, {g.index}, {g.utilization_pct:.0f}, {g.used_mib:.0f}\n")
                f.flush()
                tick += period_s
                time.sleep(max(0.0, tick - time.time()))
    finally:
        probe.close()
    return 0


def report(samples: Path, summary: Path, gpus: list[int]) -> list[Busy]:
    run: dict[str, Any] = json.loads(summary.read_text())
    return [busy(read_samples(samples, g), float(run["started"]), float(run["finished"]), g) for g in gpus]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="sample NVML until a signal")
    s.add_argument("samples", type=Path)
    s.add_argument("--period-s", type=float, default=0.25)
    r = sub.add_parser("report", help="the busy share of each GPU over a run's window")
    r.add_argument("samples", type=Path)
    r.add_argument("summary", type=Path, help="the run's run_summary.json")
    r.add_argument("--gpus", default="0", help="GPU indices, e.g. 0,1")
    r.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.command == "sample":
        if args.period_s <= 0 or args.period_s > 0.5:
            parser.error(f"--period-s {args.period_s}: give 0 < period <= 0.5 (at least 2 Hz)")
        return sample(args.samples, args.period_s)
    found = report(args.samples, args.summary, [int(g) for g in args.gpus.split(",")])
    for b in found:
        print(
            f"GPU {b.gpu}: busy share {b.share:.3f} over {b.window_s:.1f} s ({b.samples} samples, {b.hz:.1f} Hz); "
            f"idle: start {b.start_s:.1f} s, hand-offs {b.handoffs_s:.1f} s, tail {b.tail_s:.1f} s"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(b) for b in found], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

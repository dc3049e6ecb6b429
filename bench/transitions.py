#!/usr/bin/env python3
"""A stage transition against a raw Celery chain's, side by side in one run.

    python bench/transitions.py [--runs 10] [--json FILE]

framefleet: the README's hand-started cluster (two solo workers, ``gpu0`` and ``cpu``, confined by this
host's allowed roots) on a private Redis; runs of one video each through ``framefleet enqueue``, each into
its own OUT, one after the other; every gap between a stage's end and the next one's start is read from
each run's ``run_summary.json`` (``overhead_after_*``, to the microsecond). The raw chain: five no-op
Celery tasks with the same routing (cpu → gpu0 ×3 → cpu), JSON, late acks and prefetch 1 (bench/rawchain.py)
on a private Redis of its own, its two solo workers up beside framefleet's. The two alternate: after a
warm-up of each (not counted), each of the ``--runs`` rounds is one framefleet run then two raw chains, so
that a load from elsewhere on a shared machine falls on both. Prints the medians, their ratio, and the
load (1-minute average) before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.modes_queue import _wait_registered, private_redis, processes  # noqa: E402  (sets the synthetic backends)

RAW_CHAINS_PER_RUN = 2


def framefleet_run(raw: Path, out: Path, env: dict[str, str]) -> list[float]:
    """One run of ``raw`` into ``out`` through ``framefleet enqueue``: its transitions' gaps (s)."""
    enqueue = [sys.executable, "-m", "tasks.cli.main", "enqueue", str(raw), "--out", str(out)]
    done = subprocess.run(enqueue, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"enqueue failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    summary = json.loads((out / "run_summary.json").read_text())
    return [v["mean_s"] for e in summary["stages"].values() for k, v in e.items() if k.startswith("overhead_after_")]


def raw_chain_gaps(rawchain: Any) -> list[float]:
    """One raw chain, waited for: its transitions' gaps (s)."""
    steps = rawchain.chain_of().apply_async().get(timeout=60)
    return [b["start"] - a["end"] for a, b in zip(steps, steps[1:], strict=False)]


def raw_worker(queue: str) -> list[str]:
    celery = [sys.executable, "-m", "celery", "-A", "bench.rawchain", "worker", "-Q", queue, "-P", "solo", "-c", "1"]
    return [*celery, "-n", f"{queue}@%h", "-E", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"]


def measure(runs: int, work: Path) -> dict[str, list[float]]:
    """Gaps (s) of framefleet's transitions and of the raw chain's, measured alternately (module doc)."""
    from tasks.autoscaler.supervisor import worker_argv
    from tasks.cli.sample import make_video

    raw = work / "raw"
    raw.mkdir(parents=True)
    make_video(raw / "clip.mp4", 320, 240, 15, 1.0, seed=1)
    gaps: dict[str, list[float]] = {"framefleet": [], "raw": []}
    with private_redis() as ff_url, private_redis() as raw_url, processes(work / "logs") as start:
        # This host's allowed roots (tasks.workers.confinement) in a folder of the bench's own.
        env = {**os.environ, "REDIS_URL": ff_url, "XDG_STATE_HOME": str(work / "state")}
        for name in ("FRAMEFLEET_DATASET_ROOT", "FRAMEFLEET_OUTPUT_ROOT", "FRAMEFLEET_UNCONFINED"):
            env.pop(name, None)
        start("gpu0", worker_argv("gpu0", "gpu0"), env)
        start("cpu", worker_argv("cpu", "cpu"), env)
        os.environ["REDIS_URL"] = raw_url
        from bench import rawchain

        rawchain.app.conf.update(broker_url=raw_url, result_backend=raw_url)
        for queue in ("raw.cpu", "raw.gpu0"):
            start(queue, raw_worker(queue), {**os.environ, "REDIS_URL": raw_url})
        _wait_registered(ff_url, ["gpu0", "cpu"])
        deadline = time.monotonic() + 60
        while len(rawchain.app.control.ping(timeout=0.5)) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw chain workers did not answer; see {work / 'logs'}")
        framefleet_run(raw, work / "out-warm", env)  # the warm-ups: not counted
        raw_chain_gaps(rawchain)
        for i in range(runs):
            gaps["framefleet"] += framefleet_run(raw, work / f"out{i}", env)
            for _ in range(RAW_CHAINS_PER_RUN):
                gaps["raw"] += raw_chain_gaps(rawchain)
    return gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="rounds: a framefleet run of one video, two raw chains")
    parser.add_argument("--json", type=Path, help="write the gaps (s) and the loads here")
    args = parser.parse_args(argv)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="ff-transitions-") as tmp:
        gaps = measure(args.runs, Path(tmp))
    loads.append(os.getloadavg()[0])
    ff_ms, raw_ms = (1000 * statistics.median(gaps[k]) for k in ("framefleet", "raw"))
    print(
        f"framefleet {ff_ms:.2f} ms median ({len(gaps['framefleet'])} transitions), raw chain {raw_ms:.2f} ms "
        f"({len(gaps['raw'])}), ratio {ff_ms / raw_ms:.2f}; load {loads[0]:.2f} → {loads[1]:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps({**gaps, "loads": loads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

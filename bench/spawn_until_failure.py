#!/usr/bin/env python3
"""The baseline the autoscaler replaces: spawn model workers on one GPU until one fails, with no OOM handling.

    python bench/spawn_until_failure.py --gpu 0 --hold-mib 13000 --activation-mib 3000 [--rounds 5]
    python bench/spawn_until_failure.py --stages-config FILE --raw RAW --inputs OUT --gpu 0 [--every-s 2]

Synthetic: each worker holds ``hold_mib`` after loading (the model) and ``activation_mib`` more while it
infers, like the predecessor's pool. Workers are started one at a time until a start fails; then all
infer at once. Prints how many loaded and how many died.

``--stages-config``: the same pool with real stage processes (bench/stage_worker.py, each from its
stage's interpreter in FILE's settings): one process per model stage per round, a new round every
``--every-s`` seconds until a process fails (to load, or otherwise), ``--max-rounds`` is reached or
host RAM falls below ``--host-floor-mib``; then every loaded process gets its share of the videos of
RAW at once (inputs read from OUT, a finished run's intermediates). A process that fails takes its
unfinished videos with it (no retries). Prints one JSON line (bench/stage_pool.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKER = r"""
import sys, torch
hold, act, rounds = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
model = torch.ones(int(hold * 2**20), dtype=torch.uint8, device="cuda")
w = torch.randn(256, 256, device="cuda")
print("loaded", flush=True)
sys.stdin.readline()
for _ in range(rounds):
    activations = torch.ones(int(act * 2**20), dtype=torch.uint8, device="cuda")
    for _ in range(2000):
        torch.mm(w, w)
    torch.cuda.synchronize()
    del activations
print("done", flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--hold-mib", type=float, default=13000)
    parser.add_argument("--activation-mib", type=float, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-workers", type=int, default=32)
    parser.add_argument("--stages-config", type=Path, help="settings file: the pool of real stage processes")
    parser.add_argument("--raw", type=Path, help="--stages-config: the videos")
    parser.add_argument("--inputs", type=Path, help="--stages-config: a finished run's output folder (its inputs)")
    parser.add_argument("--every-s", type=float, default=2.0, help="--stages-config: seconds between rounds")
    parser.add_argument("--max-rounds", type=int, default=16)
    parser.add_argument("--host-floor-mib", type=float, default=49152.0, help="no new round below this MemAvailable")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="--stages-config: give up after this long")
    parser.add_argument("--device", default="cuda:0", help="--stages-config: cpu only to try the script out")
    parser.add_argument("--log-dir", type=Path, help="--stages-config: one log per process here")
    args = parser.parse_args()
    if args.stages_config:
        if not (args.raw and args.inputs):
            parser.error("--stages-config needs --raw and --inputs")
        from bench.stage_pool import run_pool

        print(json.dumps(run_pool(args)))
        return 0
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(args.gpu)}
    started = time.monotonic()
    procs: list[subprocess.Popen[str]] = []
    load_failure = None
    for _ in range(args.max_workers):
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(args.hold_mib), str(args.activation_mib), str(args.rounds)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = proc.stdout.readline()
        if line.strip() != "loaded":
            proc.wait()
            load_failure = (proc.stderr.read().strip().splitlines() or ["?"])[-1]
            break
        procs.append(proc)
    loaded = len(procs)
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    died = []
    for proc in procs:
        proc.wait()
        if proc.returncode != 0:
            died.append((proc.stderr.read().strip().splitlines() or ["?"])[-1][:200])
    result = {
        "loaded": loaded,
        "load_failure": load_failure,
        "died_during_inference": len(died),
        "finished": loaded - len(died),
        "first_error": died[0] if died else None,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The baseline the autoscaler replaces: spawn model workers on one GPU until one fails to load.

    python bench/spawn_until_failure.py --gpu 0 --hold-mib 13000 --activation-mib 3000 [--rounds 5]

Each worker holds ``hold_mib`` after loading (the model) and ``activation_mib`` more while it
infers, with no out-of-memory handling, like the predecessor's pool. Workers are started one at
a time until a start fails; then all infer at once. Prints how many loaded and how many died.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

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
    args = parser.parse_args()
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

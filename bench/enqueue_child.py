#!/usr/bin/env python3
"""One ``enqueue`` in a process of its own, for bench/scale.py: the code under test is ``--code``'s tree.

    python bench/enqueue_child.py --code ROOT RAW OUT [--window 64] [--resume]

Prints one JSON line: seconds to the first chain sent and to the call's return (every video sent or
held), the CPU seconds the call used (about its wall time on an idle machine, less Redis's share),
the videos sent and found complete, the process's memory before the call and at its peak (VmRSS,
VmHWM), and the folder ``tasks`` was imported from. No worker runs: "sent" is the first
chain's message written to Redis, the moment a waiting worker could take it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", type=Path, required=True)
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve()))
    os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")
    from celery import canvas

    import tasks
    from tasks import settings  # the app with everything it registers, as a command loads it
    from tasks.cli.enqueue import enqueue

    first: list[float] = []
    send = canvas._chain.apply_async

    def timed(self: object, *a: object, **k: object) -> object:
        first.append(time.perf_counter()) if not first else None
        return send(self, *a, **k)

    canvas._chain.apply_async = timed  # type: ignore[method-assign]
    conf = settings()
    rss_before = status_kib("VmRSS")
    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = before.ru_utime + before.ru_stime
    start = time.perf_counter()
    record = enqueue(conf, args.raw, args.out, window=args.window, resume=args.resume)
    end = time.perf_counter()
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "run_id": record["run_id"],
                "first_sent_s": (first[0] - start) if first else None,
                "all_recorded_s": end - start,
                "cpu_s": used.ru_utime + used.ru_stime - cpu_before,
                "videos": record["videos"],
                "already_complete": record["already_complete"],
                "rss_before_mib": rss_before / 1024,
                "peak_rss_mib": status_kib("VmHWM") / 1024,
                "tasks_from": str(Path(tasks.__file__).parent),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

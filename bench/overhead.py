#!/usr/bin/env python3
"""Print the per-stage task overhead of a finished run: the time from one stage's end to the next's start.

    python bench/overhead.py OUT            (OUT holds run_summary.json)

With several videos the gap includes time waiting in the queue behind other videos; a run of
one video shows the dispatch overhead alone. Gaps are shown in ms to the µs, as run_summary.json
keeps them; bench/transitions.py sets them beside a raw Celery chain's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(out: Path) -> int:
    summary = json.loads((out / "run_summary.json").read_text())
    print(f"{summary['done']} videos, wall {summary['wall_s']:.1f} s")
    print(f"{'stage':<11}{'run mean s':>11}{'gap before mean ms':>20}{'gap max ms':>12}")
    for stage in ("preprocess", "depth", "tracks", "hands", "h5"):
        entry = summary["stages"][stage]
        gap = next((v for k, v in entry.items() if k.startswith("overhead_after_")), None)
        mean_ms, max_ms = (1000 * gap["mean_s"], 1000 * gap["max_s"]) if gap else (float("nan"), float("nan"))
        print(f"{stage:<11}{entry.get('mean_s', 0):>11.3f}{mean_ms:>20.3f}{max_ms:>12.3f}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a finished run's OUT (it holds run_summary.json)")
    sys.exit(main(parser.parse_args().out))

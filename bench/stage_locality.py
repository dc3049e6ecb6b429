"""Which GPU ran each GPU stage of each video, read from the GPU workers' logs of a run; prints JSON.

    python bench/stage_locality.py OUT   (OUT/logs/gpu*.log, as run_local.py writes them)

Every worker logs "ran <stage> of <video>"; its log is named after its queue (``gpu{N}`` or
``gpu{N}.{stage}``). A video is "local" when all its GPU stages ran on one N.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

RAN = re.compile(r"ran (\w+) of (\S+)")
LOG = re.compile(r"^gpu(\d+)(?:\.\w+)?(?:-\d+)?\.log$")


def main(out: Path) -> dict:
    videos: dict[str, dict[str, int]] = defaultdict(dict)
    for log in sorted((out / "logs").glob("gpu*.log")):
        m = LOG.match(log.name)
        if not m:
            continue
        for line in log.read_text(errors="replace").splitlines():
            if ran := RAN.search(line):
                videos[ran.group(2)][ran.group(1)] = int(m.group(1))
    per_stage = Counter(f"{stage}:gpu{g}" for gpus in videos.values() for stage, g in gpus.items())
    local = sum(1 for gpus in videos.values() if len(set(gpus.values())) == 1)
    return {
        "videos": len(videos),
        "local": local,
        "per_stage_gpu": dict(sorted(per_stage.items())),
        "by_video": dict(videos),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a finished run's OUT (its logs/ hold the GPU workers' logs)")
    print(json.dumps(main(parser.parse_args().out), indent=1, sort_keys=True))

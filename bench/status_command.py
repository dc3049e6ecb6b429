"""``framefleet status`` as people run it, wall time, against another tree's code in the same sitting (issue 25,
item 4: status ≤ 1 s during a million-video run).

    python bench/status_command.py --baseline-code /tmp/base --videos 1000000 --runs 10 --json /tmp/status.json

where ``/tmp/base`` is ``git archive`` of the code to compare with. Both trees run through this interpreter's
``framefleet`` console script with PYTHONPATH at the tree (ahead of the editable install), each tree's
modules compiled first (a session that sets PYTHONDONTWRITEBYTECODE would otherwise time the compiler),
the two in turn (A B B A …) so that a drift of the machine's load falls on both. Three moments, each on a
private redis-server:

- ``--help``: the interpreter and the command table, nothing of a subcommand;
- idle: ``framefleet status`` with an empty Redis (no run, no worker);
- live: ``framefleet status RUN`` beside a simulated live run of ``--videos`` (bench/live_run.py, its last
  window: every structure of the run in Redis at once), with ``status.render`` in-process for the part
  that is the command's own work. ``--redis-url URL`` builds the run in a Redis you started (flushing
  it) and leaves it there; ``--redis-url URL --run RUN`` then times it again without building it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modes_queue import private_redis  # noqa: E402

os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")  # as bench/scale.py's runs
FRAMEFLEET = Path(sys.executable).parent / "framefleet"


def compiled(tree: Path) -> None:
    """Write the tree's bytecode, as an install does, so that each run reads it instead of compiling."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(tree / "tasks"), str(tree / "worker_config")],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def side_by_side(trees: dict[str, Path], argv: list[str], url: str, runs: int) -> dict[str, Any]:
    """Wall seconds of ``framefleet ARGV`` for each tree, ``runs`` times in turn after one warm-up each;
    median, min and max per tree, and the median of the per-pair ratio (the first tree over the second)."""
    took: dict[str, list[float]] = {name: [] for name in trees}
    names = list(trees)
    for i in range(runs + 1):
        for name in names if i % 2 else names[::-1]:
            env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(trees[name])}
            t = time.perf_counter()
            done = subprocess.run([str(FRAMEFLEET), *argv], env=env, cwd=trees[name], capture_output=True)
            elapsed = time.perf_counter() - t
            if done.returncode:
                raise RuntimeError(
                    f"{name}: framefleet {' '.join(argv)} exited {done.returncode}: {done.stderr[-800:]}"
                )
            if i:  # the first round warms the file cache
                took[name].append(elapsed)
    found: dict[str, Any] = {
        name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)} for name, t in took.items()
    }
    if len(names) == 2:
        pairs = [a / b for a, b in zip(took[names[0]], took[names[1]], strict=True)]
        found["ratio_median"] = statistics.median(pairs)
    return found


def render_s(url: str, run_id: str, repeat: int) -> dict[str, float]:
    """Seconds of ``status.render`` (this tree's) in-process: the command's work less starting Python."""
    import redis

    from tasks.cli import status
    from tasks.run import runs
    from worker_config.settings import load_settings

    conf = load_settings()
    chosen = runs.lookup(redis.Redis.from_url(url, decode_responses=True), run_id)
    took = []
    for _ in range(repeat):
        t = time.perf_counter()
        status.render(conf, None, chosen)
        took.append(time.perf_counter() - t)
    return {"median_s": statistics.median(took), "max_s": max(took)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-code", type=Path, required=True, help="a tree of the code to compare with")
    parser.add_argument("--videos", type=int, default=1_000_000, help="videos of the simulated live run")
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each command per tree")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-status-bench"))
    parser.add_argument("--redis-url", help="a Redis you started: the live run is built there (flushing it) and kept")
    parser.add_argument("--run", help="with --redis-url: the run to show instead of building one")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    trees = {"now": ROOT, "baseline": args.baseline_code.resolve()}
    for tree in trees.values():
        compiled(tree)
    results: dict[str, Any] = {
        "load_before": os.getloadavg(),
        "runs": args.runs,
        "trees": {k: str(v) for k, v in trees.items()},
    }
    with private_redis() as url:
        results["help"] = side_by_side(trees, ["--help"], url, args.runs)
        print(f"framefleet --help: {json.dumps(results['help'])}", flush=True)
        results["idle"] = side_by_side(trees, ["status"], url, args.runs)
        print(f"framefleet status, empty Redis: {json.dumps(results['idle'])}", flush=True)
    if args.run:
        results["live"] = live(trees, args.redis_url, args.run, args.runs)
    else:
        from bench import live_run
        from bench.scale import tiny_run

        args.work.mkdir(parents=True, exist_ok=True)
        with nullcontext(args.redis_url) if args.redis_url else private_redis() as url:
            os.environ["REDIS_URL"] = url
            tiny = tiny_run(args.work)
            built = live_run.live_run(args.videos, url, tiny, keep=True, main_layout=False)
            print(f"live run of {args.videos} built in {url}: {built['run_id']}", flush=True)
            results["live"] = {"videos": args.videos, **live(trees, url, built["run_id"], args.runs)}
    print(f"framefleet status RUN beside the live run: {json.dumps(results['live'])}", flush=True)
    results["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def live(trees: dict[str, Path], url: str, run_id: str, runs: int) -> dict[str, Any]:
    """The render in-process and each tree's ``framefleet status RUN`` beside the run ``run_id`` at ``url``."""
    import redis

    os.environ["REDIS_URL"] = url  # this tree's settings, for the render in-process
    found: dict[str, Any] = {"run_id": run_id, "keys_in_redis": redis.Redis.from_url(url).dbsize()}
    found["render"] = render_s(url, run_id, 5)
    found["command"] = side_by_side(trees, ["status", run_id], url, runs)
    return found


if __name__ == "__main__":
    sys.exit(main())

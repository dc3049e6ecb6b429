#!/usr/bin/env python3
"""One run's statistics callback (``aggregate``) in a process of its own, for bench/scale.py: the code under
test is ``--code``'s tree, the run's record is given as JSON.

    python bench/callback_child.py --code ROOT RUN_JSON

Prints one JSON line: the callback's wall and CPU seconds, the seconds spent in each of its parts that
the tree has as a function (reading the outcomes, recording them for the manifest, the statistics, the
summary's files, retiring the run in Redis, the report), the process's peak memory (VmHWM) and that of
the report's child process (and its CPU seconds), and the summary's counts. The part not in a named
function (in main's tree: reading, tallying and writing the outcomes a chunk at a time; in this one: the
summary's done list sorted)
is the wall time less the parts. With FF_CALLBACK_PROFILE=FILE set, the callback runs under cProfile and
its statistics go to FILE.<run id>, the report child's to FILE.<run id>.report (the timings then include
the profiler's cost).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

PARTS = {  # part -> (module, function) where the tree has it
    "outcomes_read": ("tasks.run.completion", "outcomes"),
    "counters_read": ("tasks.run.completion", "counted"),
    "outcomes_files_closed": ("tasks.records.outcome_files", "close"),
    "notes_read": ("tasks.records.outcome_files", "notes_of"),
    "manifest_recorded": ("tasks.records.lineage", "record_outcomes"),
    "outcomes_file_committed": ("tasks.records.lineage", "Outcomes.commit"),
    "statistics": ("tasks.run.aggregate", "write_statistics_from"),
    "statistics_header_sets": ("tasks.statistics.stats_file", "_header_sets"),  # of the statistics: the header's sets
    "statistics_header_pass": ("tasks.records.lineage", "backend_sets"),  # main's header: the manifest's pass
    "quarantine": ("tasks.records.quarantine", "update"),
    "summary_json": ("tasks.run.aggregate", "write_text_atomic"),
    "summary_files": ("tasks.run.runs", "finished"),
    "retire_redis": ("tasks.run.aggregate", "_retire"),
    "report_quality_table": ("tasks.run.aggregate", "_quality_table"),  # the report's table from the end's read
    "report": ("tasks.run.aggregate", "write_report"),
}


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished children (the report's process)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(used.ru_utime + used.ru_stime)


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def timed(spent: dict[str, float], part: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[part] = spent.get(part, 0.0) + time.perf_counter() - start

    return wrapper


def _profile_report(aggregate: Any, path: str) -> None:
    """Run the report's child process, where the tree has one, under cProfile too (its statistics to ``path``)."""
    import subprocess

    def profiled(real: Any) -> Any:
        def start(cmd: Any, *a: Any, **k: Any) -> Any:
            if isinstance(cmd, list) and cmd[1:3] == ["-m", "tasks.report.report"]:
                cmd = [cmd[0], "-m", "cProfile", "-o", path, *cmd[1:]]
            return real(cmd, *a, **k)

        return start

    if hasattr(aggregate, "subprocess"):  # the report started by subprocess.run (main) or Popen (now)
        import types

        wrapped = {"run": profiled(subprocess.run), "Popen": profiled(subprocess.Popen)}
        aggregate.subprocess = types.SimpleNamespace(**{**vars(subprocess), **wrapped})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", type=Path, required=True)
    parser.add_argument("run", help="the run's record, JSON")
    args = parser.parse_args()
    code = str(args.code.resolve())
    sys.path.insert(0, code)
    os.environ["PYTHONPATH"] = code  # the report's child process: python -m tasks.report.report from the same tree
    os.chdir(code)
    os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")
    import importlib

    import tasks
    from tasks import settings  # the app with everything it registers, as a command loads it
    from tasks.run import aggregate

    settings()
    spent: dict[str, float] = {}
    for part, (module, name) in PARTS.items():
        try:
            owner: Any = importlib.import_module(module)
        except ModuleNotFoundError:  # a part another tree does not have
            continue
        *path, attr = name.split(".")
        for step in path:
            owner = getattr(owner, step, None)
        if owner is not None and hasattr(owner, attr):
            setattr(owner, attr, timed(spent, part, getattr(owner, attr)))
    run = json.loads(args.run)
    rss_before = status_kib("VmRSS")
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    profile = os.environ.get("FF_CALLBACK_PROFILE")  # a file for cProfile's stats of the callback (off: none)
    if profile:
        import cProfile

        _profile_report(aggregate, f"{profile}.{run['run_id']}.report")

        profiler = cProfile.Profile()
        result = profiler.runcall(aggregate.aggregate.run, run)
        profiler.dump_stats(f"{profile}.{run['run_id']}")
    else:
        result = aggregate.aggregate.run(run)
    wall = time.perf_counter() - start
    used = resource.getrusage(resource.RUSAGE_SELF)
    nested = spent.get("outcomes_file_committed", 0.0)  # inside no other part
    print(
        json.dumps(
            {
                "wall_s": wall,
                "cpu_s": used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime,
                "parts_s": spent,
                "unnamed_s": wall - sum(spent.values()) + 0 * nested,
                "rss_before_mib": rss_before / 1024,
                "peak_rss_mib": status_kib("VmHWM") / 1024,
                "report_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                "report_cpu_s": _children_cpu_s(),
                "videos": result.get("videos"),
                "statistics_videos": result.get("statistics_videos"),
                "tasks_from": str(Path(tasks.__file__).parent),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Show the cluster at a glance: GPUs and their workers, queues, a run's stages, the quarantine.

    framefleet status [RUN | --out OUT] [--config FILE]
    framefleet status --watch [RUN | --out OUT]      follow a run until it ends (re-attach)

GPU readings come from NVML (or the fake GPU ledger $FRAMEFLEET_FAKE_GPU); workers, queues and
progress from Redis. The run shown is RUN, else the newest run of OUT, else the newest run in
Redis. With --out the quarantine is read from OUT; without it, it is counted from Redis over
every output root. A machine without a GPU says so. Exit status 0 (with --watch: as the enqueue
command's); 2 when Redis cannot be reached, the run is unknown or the settings are bad.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tasks import keys
from tasks.cli import common as _cli
from tasks.cli.common import check_redis
from tasks.delivery import settings_queues
from tasks.delivery.queues import lengths as queue_lengths
from tasks.gpu import GpuReading, open_probe
from tasks.observe import progress
from tasks.outputs import buckets
from tasks.records import quarantine
from tasks.redis_client import get_redis
from tasks.run import runs, settings_check
from tasks.workers import registry
from worker_config.settings import Settings, redact_url

STAGE_LOG_SCANNED = 20_000  # newest stage-log entries read for the latest run's rates


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Left-aligned columns, two spaces apart."""
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def current_of(worker: dict[str, Any]) -> str:
    current = worker.get("current") or {}
    if not current.get("task"):
        return ""
    text = f"{current.get('video')} {current['task'].rsplit('.', 1)[-1]}"
    frames = worker.get("frames")
    return f"{text} {frames[0]}/{frames[1]}" if frames else text


def gpu_rows(readings: list[GpuReading], workers: list[dict[str, Any]]) -> list[list[Any]]:
    by_gpu: dict[str, list[dict[str, Any]]] = {}
    for w in workers:
        by_gpu.setdefault("cpu" if w.get("gpu") is None else str(w["gpu"]), []).append(w)
    rows = []
    for g in readings:
        mine = by_gpu.pop(str(g.index), [])
        memory = f"{g.used_mib / 1024:.1f}/{g.total_mib / 1024:.1f} GiB ({100 * g.used_mib / g.total_mib:.0f}%)"
        rows.append([g.index, g.name, memory, f"{g.utilization_pct:.0f}%", *_workers_cells(mine)])
    for key in sorted(by_gpu, key=lambda k: (k == "cpu", k)):  # workers of GPUs the probe cannot read
        name = "CPU workers" if key == "cpu" else "not read (CPU stand-in or other host)"
        rows.append([key, name, "-", "-", *_workers_cells(by_gpu[key])])
    return rows


def host_of(worker: dict[str, Any]) -> str:
    """The host part of a worker's node name (``gpu0-1@hostA`` -> ``hostA``)."""
    return str(worker.get("hostname", "")).rpartition("@")[2] or "?"


def host_rows(workers: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per host with live workers: its workers, the GPU queues they serve and what they run."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for w in workers:
        by_host.setdefault(host_of(w), []).append(w)
    rows = []
    for host in sorted(by_host):
        mine = by_host[host]
        queues = sorted({q for w in mine for q in w.get("gpu_queues", [])})
        rows.append([host, ",".join(queues) or "-", *_workers_cells(mine)])
    return rows


def _workers_cells(workers: list[dict[str, Any]]) -> list[str]:
    """The WORKERS cell (with a count per queue when a GPU's workers consume several: gpuN, gpuN.<stage>)
    and the CURRENT cell."""
    busy = sum(1 for w in workers if w.get("busy"))
    current = "; ".join(c for w in workers if (c := current_of(w)))
    per_queue: dict[str, int] = {}
    for w in workers:
        for queue in w.get("gpu_queues") or []:
            per_queue[queue] = per_queue.get(queue, 0) + 1
    count = f"{len(workers)} ({busy} busy)"
    if len(per_queue) > 1:
        count += ": " + ", ".join(f"{queue} {n}" for queue, n in sorted(per_queue.items()))
    return [count, current or "-"]


def queue_rows(conf: Settings, workers: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per queue: the cpu queue, every GPU queue seen, the stage queues of those GPUs, and the
    settings queues where tasks wait."""
    r = get_redis(conf.redis_url)
    names = {conf.cpu_queue} | registry.known_gpu_queues(r) | {q for w in workers for q in w.get("queues", [])}
    gpus = {i for q in names if (i := conf.gpu_index(q)) is not None}
    names |= {conf.stage_queue(stage, i) for i in gpus for stage in conf.own_env_stages()}
    waiting = queue_lengths(get_redis(conf.broker), sorted(names))
    # The settings queues with tasks in them: where tasks wait for workers with their run's settings.
    held = queue_lengths(get_redis(conf.broker), sorted(settings_queues.listed(r)))
    return [[name, count] for name, count in waiting.items()] + [[q, n] for q, n in held.items() if n]


def latest_run(
    conf: Settings, out: Path | None, chosen: dict[str, Any] | None = None
) -> tuple[str, list[list[Any]], str] | None:
    """A run's id, one row per stage (done, failed, rate, ETA) and a line about it: ``chosen`` (a run
    record), else the newest run in Redis."""
    r = get_redis(conf.redis_url)
    known = runs.newest_ids(r)  # one read of ff:runs, not a scan of every key
    if chosen is None and not known:
        return None
    run_id = chosen["run_id"] if chosen else known[0]
    counts = progress.read(r, run_id)
    record = chosen or _run_record(out, run_id) or runs.lookup(r, run_id) or {}
    if record.get("status", "running") == "running" and r.exists(keys.CANCELLED_PREFIX + run_id):
        record = {**record, "status": "cancelled"}  # a record written before its cancel: the flag is the truth
    over = record.get("status") not in (None, "running")
    total = record.get("videos")
    started = record.get("started") or time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    root = record.get("output_root")
    last_end = _last_ends(r, Path(root) if root else out, run_id)
    rows = []
    for stage in conf.enabled_stages():
        done, failed = counts.get(f"{stage}.done", 0), counts.get(f"{stage}.failed", 0)
        elapsed = (last_end.get(stage) or time.time()) - started
        rate = done / elapsed * 60 if done and elapsed > 0 else 0.0
        if over or total is None or not rate:
            eta = "?" if total is None and not over else ("done" if done + failed >= (total or 0) else "-")
        else:
            left = max(0, total - done - failed)
            eta = "done" if not left else time.strftime("%H:%M:%S", time.gmtime(left / rate * 60))
        rows.append([stage, done, failed, f"{rate:.1f}/min", eta])
    if total is not None:
        size = _cli.plural(total, "video")
    elif "videos" in record:  # a record of this version: its enqueuer has not finished walking the folder
        size = "size not known yet (its enqueuer is walking the folder)"
    else:
        size = "size unknown (give --out OUT for it and the ETA)"
    began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    which = f"in {record['output_root']}" if record.get("output_root") else f"latest of {r.zcard(keys.RUNS)} in Redis"
    ended = f", {record['status']}" if record.get("status") else ""
    return run_id, rows, f"run {run_id} ({which}), {size}, started {began}{ended}"


def _run_record(out: Path | None, run_id: str) -> dict[str, Any]:
    try:
        return json.loads((out / "runs" / f"{run_id}.json").read_text()) if out else {}
    except (OSError, ValueError):
        return {}


def _last_ends(r: Any, out: Path | None, run_id: str) -> dict[str, float]:
    """When each stage last ended in the run: from its stage log (Redis while live, else its file in OUT)."""
    ends: dict[str, float] = {}
    for entry in runs.stage_log(r, out, run_id, last=STAGE_LOG_SCANNED)[0]:
        if entry.get("ok"):
            ends[entry["stage"]] = max(ends.get(entry["stage"], 0.0), float(entry["end"]))
    return ends


def quarantine_line(conf: Settings, out: Path | None) -> str:
    if out is not None:
        path = out / "quarantine.jsonl"
        try:
            count = sum(1 for line in path.read_text().splitlines() if line.strip())
        except OSError:
            count = 0
        return f"quarantined: {count} (in {path})"
    counts = quarantine.counts(get_redis(conf.redis_url))  # one read, not a scan of every key
    return f"quarantined: {sum(counts.values())} (in Redis, {len(counts)} output folder(s); --out OUT for one)"


def settings_lines(conf: Settings, record: dict[str, Any], workers: list[dict[str, Any]]) -> list[str]:
    """What an unfinished run's stage settings ask that no live worker runs, one line per stage; else nothing."""
    if record.get("status") not in (None, "running"):
        return []
    lines = settings_check.differences(record, workers, conf.cpu_queue)
    if not lines:
        return []
    head = "no live worker runs this run's settings for some stages; their tasks wait:"
    return ["", head, *(f"  {x}" for x in lines)]


def render(conf: Settings, out: Path | None, chosen: dict[str, Any] | None = None) -> str:
    probe = open_probe()
    try:
        readings = probe.gpus()
        no_gpu = getattr(probe, "reason", "no GPU visible") if probe.mode == "none" else None
    finally:
        probe.close()
    workers = registry.live_workers(get_redis(conf.redis_url))
    parts = [f"framefleet status at {time.strftime('%Y-%m-%d %H:%M:%S')} ({redact_url(conf.redis_url)})", ""]
    if no_gpu:
        parts.append(f"no GPU visible ({no_gpu}); GPU queues are served by CPU stand-ins if any")
    parts += [table(["GPU", "NAME", "MEMORY", "UTIL", "WORKERS", "CURRENT"], gpu_rows(readings, workers)), ""]
    # GPU memory is read on this host only; every host's workers are listed here.
    parts += [table(["HOST", "GPU QUEUES", "WORKERS", "CURRENT"], host_rows(workers)), ""]
    parts += [table(["QUEUE", "WAITING"], queue_rows(conf, workers)), ""]
    run = latest_run(conf, out, chosen)
    if run is None:
        parts.append("no run in Redis yet")
    else:
        parts += [run[2], table(["STAGE", "DONE", "FAILED", "RATE", "ETA"], run[1])]
        parts += settings_lines(conf, chosen or runs.lookup(get_redis(conf.redis_url), run[0]) or {}, workers)
    parts += ["", quarantine_line(conf, out)]
    return "\n".join(parts)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=_cli.HelpFormatter)
    parser.add_argument("run", nargs="?", metavar="RUN", help="a run id (default: the newest of OUT, or in Redis)")
    parser.add_argument(
        "--out", type=buckets.root_arg, metavar="OUT", help="the run's output folder (its newest run, quarantine)"
    )
    parser.add_argument("--watch", action="store_true", help="follow the run's progress until it ends, as enqueue does")
    _cli.add_config_argument(parser)
    args = parser.parse_args(argv)
    conf = _cli.settings_from(args, celery=args.watch)
    if (why := check_redis(conf)) is not None:
        return _cli.fail(why)
    chosen = None
    if args.run or args.out is not None or args.watch:
        try:
            chosen = runs.find(get_redis(conf.redis_url), args.run, args.out)
        except runs.RunNotFound as exc:
            return _cli.fail(str(exc))
    if args.watch:
        if chosen is None:
            return _cli.fail("no run to watch: name one (RUN or --out OUT)")
        # Following loads the Celery app (the callback's result); the one-shot view reads Redis only.
        from tasks.cli import watch

        return watch.follow(conf, chosen)
    print(render(conf, args.out, chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())

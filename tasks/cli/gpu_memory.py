"""Show what holds each GPU's memory, which processes are framefleet workers, and how many fit; kills nothing.

    framefleet gpu-memory info
    framefleet gpu-memory monitor [SECONDS] [--interval-s 2]
    framefleet gpu-memory suggest [--stage-peak-mib STAGE=MIB ...] [--headroom-mib 1024]

Common options: --fake LEDGER (a fake GPU ledger instead of NVML), --config FILE.
Workers come from the Redis registry, learned peaks from the Redis hash ff:profiles
(field "<gpu name>|<stage or stage set, e.g. depth+tracks+hands>|<backend>|<resolution>",
value JSON {"peak_mib": ...}); a stage set's peak is that of one worker hosting those stages.
Exit status 0, also without a GPU or without Redis; 2 on bad arguments or settings.
"""

from __future__ import annotations

import argparse
import itertools
import math
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tasks.autoscaler import profiles
from tasks.autoscaler.profiles import PROFILES_KEY, Profile, ProfileKey
from tasks.cli import common as _cli
from tasks.gpu import GpuProbe, GpuReading, ProcessReading, open_probe
from tasks.redis_client import get_redis
from tasks.stages import GPU_STAGES
from tasks.workers.registry import live_workers
from worker_config.settings import Settings, redact_url

NO_GPU = "no GPU visible (no NVML or no device); nothing to show"
DEFAULT_HEADROOM_MIB = 1024.0


@dataclass
class Cluster:
    """What Redis knows: this host's live workers by pid, learned profiles, or why Redis could not be read."""

    workers: dict[int, dict[str, Any]]
    elsewhere: int
    profiles: list[tuple[ProfileKey, Profile]]
    problem: str | None = None


def read_cluster(conf: Settings) -> Cluster:
    try:
        r = get_redis(conf.redis_url)
        workers = live_workers(r)
        stored = profiles.load_all(r)
    except redis.RedisError as exc:
        return Cluster(
            {},
            0,
            [],
            f"Redis at {redact_url(conf.redis_url)} is unreachable ({exc}); "
            "framefleet workers and learned profiles are not shown",
        )
    # A pid means something only on its own host.
    local = {int(w["pid"]): w for w in workers if w.get("pid") is not None and _on_this_host(w.get("hostname", ""))}
    return Cluster(local, len(workers) - len(local), learned(stored))


def learned(stored: dict[str, Profile | None]) -> list[tuple[ProfileKey, Profile]]:
    """The readable profiles with their keys, by GPU model then stage order; the others are named on stderr."""
    found = []
    for field, profile in stored.items():
        if profile is None:
            print(f"framefleet: ignoring profile {field!r}: its value has no numeric peak_mib", file=sys.stderr)
            continue
        try:
            found.append((ProfileKey.parse(field), profile))
        except ValueError as exc:
            print(f"framefleet: ignoring profile: {exc}", file=sys.stderr)
    return sorted(found, key=lambda kp: (kp[0].gpu_name, _stage_order(kp[0].stages), kp[0].backend, kp[0].resolution))


def render_info(gpus: list[GpuReading], processes: list[ProcessReading], cluster: Cluster) -> str:
    lines = []
    if cluster.problem:
        lines.append(cluster.problem)
    seen_workers = set()
    for gpu in gpus:
        lines.append(f"GPU {gpu.index}  {gpu.name}  ({gpu.uuid})")
        lines.append(
            f"  memory {gpu.used_mib:.0f} / {gpu.total_mib:.0f} MiB used, {gpu.free_mib:.0f} MiB free; "
            f"utilisation {gpu.utilization_pct:.0f}%"
        )
        on_gpu = [p for p in processes if p.gpu == gpu.index]
        if not on_gpu:
            lines.append("  no compute processes")
        for proc in sorted(on_gpu, key=lambda p: -p.used_mib):
            worker = cluster.workers.get(proc.pid)
            if worker is not None:
                seen_workers.add(proc.pid)
                what = f"framefleet worker {_describe_worker(worker)}"
            else:
                what = f"other process ({_command_name(proc.pid)})"
            lines.append(f"  pid {proc.pid:>7}  {proc.used_mib:>8.0f} MiB  {what}")
    idle = [w for pid, w in sorted(cluster.workers.items()) if pid not in seen_workers]
    if idle:
        lines.append("framefleet workers of this host holding no GPU memory:")
        lines += [f"  pid {w['pid']:>7}  {_describe_worker(w)}" for w in idle]
    if cluster.elsewhere:
        lines.append(f"({cluster.elsewhere} framefleet worker(s) registered on other hosts)")
    if not cluster.problem:
        if cluster.profiles:
            lines.append(f"learned profiles ({PROFILES_KEY}):")
            lines += [
                f"  {k.gpu_name} | {k.stages} | {k.backend} | {k.resolution}: peak {p.peak_mib:.0f} MiB"
                for k, p in cluster.profiles
            ]
        else:
            lines.append(f"no learned profiles yet ({PROFILES_KEY} is empty)")
    return "\n".join(lines)


def render_suggest(gpus: list[GpuReading], cluster: Cluster, given: dict[str, float], headroom_mib: float) -> str:
    lines = [cluster.problem] if cluster.problem else []
    lines.append(f"workers that fit = floor((total - {headroom_mib:.0f} MiB headroom) / stage peak)")
    for gpu in gpus:
        lines.append(f"GPU {gpu.index}  {gpu.name}  {gpu.total_mib:.0f} MiB")
        rows = [(stage, "given", peak) for stage, peak in given.items()]
        rows += [
            (k.stages, f"learned, {k.backend} {k.resolution}", p.peak_mib)
            for k, p in cluster.profiles
            if k.gpu_name == gpu.name and k.stages not in given
        ]
        if not rows:
            lines.append(
                f"  no peak known for this GPU model; pass --stage-peak-mib STAGE=MIB "
                f"(stages: {', '.join(GPU_STAGES)}) or let the workers learn some"
            )
        width = max((len(row[0]) for row in rows), default=0)
        for stage, source, peak in sorted(rows, key=lambda row: (_stage_order(row[0]), row[1])):
            fit = workers_that_fit(gpu.total_mib, peak, headroom_mib)
            lines.append(f"  {stage:<{width}}  peak {peak:>8.0f} MiB ({source}): {fit} worker(s)")
    return "\n".join(lines)


def workers_that_fit(total_mib: float, peak_mib: float, headroom_mib: float) -> int:
    return max(0, math.floor((total_mib - headroom_mib) / peak_mib))


def parse_stage_peak(text: str) -> tuple[str, float]:
    stage, sep, value = text.partition("=")
    try:
        peak = float(value)
    except ValueError:
        peak = math.nan
    if not sep or not all(part in GPU_STAGES for part in stage.split("+")) or not peak > 0:
        raise argparse.ArgumentTypeError(
            f"--stage-peak-mib takes STAGE=MIB with STAGE one of {', '.join(GPU_STAGES)} (or a worker's set "
            f"of them joined by '+') and MIB > 0, e.g. depth=14000 or depth+tracks+hands=16000; got {text!r}"
        )
    return stage, peak


def monitor(probe: GpuProbe, conf: Settings, seconds: float | None, interval_s: float) -> None:
    """A reading at 0, interval_s, 2 * interval_s, ... up to ``seconds``: the k-th is due at k * interval_s
    from the start, so a slow reading delays the next one but never drops one."""
    started = time.monotonic()
    clear = sys.stdout.isatty()
    for k in itertools.count():
        due = k * interval_s
        if seconds is not None and due > seconds:
            return
        time.sleep(max(0.0, started + due - time.monotonic()))
        frame = render_info(probe.gpus(), probe.processes(), read_cluster(conf))
        stamp = time.strftime("%H:%M:%S")
        print(("\033[H\033[J" if clear else "") + f"-- {stamp} --\n{frame}", flush=True)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=_cli.HelpFormatter)
    parser.add_argument("command", choices=("info", "monitor", "suggest"), nargs="?", default="info")
    parser.add_argument("seconds", nargs="?", type=float, help="monitor: how long (default: until Ctrl-C)")
    parser.add_argument("--interval-s", type=float, default=2.0, help="monitor: seconds between readings")
    parser.add_argument(
        "--stage-peak-mib",
        type=parse_stage_peak,
        action="append",
        nargs="+",
        default=[],
        metavar="STAGE=MIB",
        help="suggest: a stage's peak memory, overriding learned ones",
    )
    parser.add_argument(
        "--headroom-mib", type=float, default=DEFAULT_HEADROOM_MIB, help="suggest: memory kept free on each GPU"
    )
    parser.add_argument("--fake", metavar="LEDGER", help="read a fake GPU ledger (tasks.gpu.fake) instead of NVML")
    _cli.add_config_argument(parser)
    args = parser.parse_intermixed_args(argv)
    if args.seconds is not None and (args.command != "monitor" or args.seconds < 0):
        parser.error(f"SECONDS ({args.seconds:g}) goes with `monitor` only and must be >= 0")
    if args.interval_s <= 0 or args.headroom_mib < 0:
        parser.error("--interval-s must be > 0 and --headroom-mib >= 0")
    given = dict(pair for group in args.stage_peak_mib for pair in group)
    if args.fake and not Path(args.fake).is_file():
        return _cli.fail(f"no fake GPU ledger at {args.fake}; pass the path of an existing ledger file to --fake")
    conf = _cli.settings_from(args)

    probe = open_probe(args.fake)
    try:
        if probe.mode == "none":
            print(NO_GPU)
            return 0
        if args.command == "info":
            print(render_info(probe.gpus(), probe.processes(), read_cluster(conf)))
        elif args.command == "suggest":
            print(render_suggest(probe.gpus(), read_cluster(conf), given, args.headroom_mib))
        else:
            monitor(probe, conf, args.seconds, args.interval_s)
    except KeyboardInterrupt:
        print()
    except FileNotFoundError as exc:  # a fake ledger named by $FRAMEFLEET_FAKE_GPU that does not exist
        return _cli.fail(str(exc))
    finally:
        probe.close()
    return 0


def _on_this_host(nodename: str) -> bool:
    host = nodename.rpartition("@")[2]
    return host.split(".")[0] == socket.gethostname().split(".")[0]


def _describe_worker(worker: dict[str, Any]) -> str:
    queues = ",".join(worker.get("queues") or []) or "?"
    state = "busy" if worker.get("busy") else "idle"
    return f"{worker.get('hostname', '?')} (queues {queues}, {state})"


def _command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "not visible from here"


def _stage_order(stage: str) -> int:
    return GPU_STAGES.index(stage) if stage in GPU_STAGES else len(GPU_STAGES)


if __name__ == "__main__":
    sys.exit(main())

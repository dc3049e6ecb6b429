"""The autoscaler's command line: supervise this host's solo GPU workers, one family per queue on each GPU.

    python scripts/autoscaler.py [--gpus all|0,1] [--max-workers-per-gpu N] [--headroom-mib M]
                                 [--tick-s S] [--cpu-workers N] [--config FILE] [--fake-gpu LEDGER]
    (or python -m tasks.autoscaler ...)

Every tick it reads NVML (or a fake GPU ledger), the worker registry, queue backlogs, host RAM and
the OOM records (ff:oom), decides per GPU (tasks.autoscaler.policy) and acts by starting a worker or
warm-stopping the newest. A GPU's workers come in families, one per queue: gpuN for the stages of
the main environment and gpuN.<stage> for each stage with its own python (started from it); each
family has its own learned peak, backlog and worker count, and counts the others as used memory; a
family of a later stage also grows on the tasks upstream of it on the GPU (--chain-horizon-s).
Tasks of a run whose settings no live worker has wait in a settings queue (gpuN~<stage>-<hash>); the
autoscaler writes that run's recorded stage settings to a file (under --log-dir/settings, else a
temporary folder) and starts a family of workers from it (gpuN~<tag>-<n>), down to none once idle.
Each change is logged, sent as a Celery event (autoscale-up, autoscale-down, autoscale-restart)
and appended to the Redis list ff:autoscale. Without a readable GPU it runs --cpu-workers stand-in
workers for each gpu0 family and only keeps them alive. SIGINT or SIGTERM warm-stops every worker
(SIGKILL after --stop-grace-s) and exits 0; a second signal kills at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from tasks.autoscaler.families import family_argv
from tasks.autoscaler.policy import AutoscalePolicy
from tasks.autoscaler.service import Autoscaler
from tasks.autoscaler.supervisor import Supervisor
from tasks.cli.common import HelpFormatter, add_config_argument, fail, parse_gpus, settings_from
from tasks.gpu import INDEX_ENV, LEDGER_ENV, open_probe
from tasks.observe.metrics import start_exporter
from worker_config.settings import Settings

POLICY_FLAGS = {  # AutoscalePolicy field: (type, help)
    "max_workers_per_gpu": (int, "at most this many workers of one queue (gpuN, gpuN.<stage>) on one GPU"),
    "min_workers_per_gpu": (int, "at least this many workers of each queue on each GPU"),
    "headroom_mib": (float, "GPU memory kept free beyond the workers' learned peaks"),
    "pressure_free_mib": (float, "below this much free GPU memory, one worker is stopped"),
    "cooldown_s": (float, "seconds between changes"),
    "idle_scale_down_s": (float, "seconds without work before a GPU goes down to its minimum"),
    "host_margin_mib": (float, "host RAM to leave free beyond another worker's RSS"),
    "max_starting_per_gpu": (int, "at most this many workers of one queue loading at once on one GPU"),
    "quick_load_s": (
        float,
        "a queue whose workers each loaded within this many seconds starts every worker that fits at once "
        "(0: always --max-starting-per-gpu at a time)",
    ),
    "busy_pct": (float, "no queue grows past its minimum on a GPU at least this busy (NVML, %%; over 100: off)"),
    "busy_window_s": (float, "seconds of NVML utilisation readings averaged for --busy-pct"),
    "min_gain": (float, "a queue whose tasks per second rose less than this fraction when workers joined stops there"),
    "trial_tasks": (int, "tasks each worker ends after a join before --min-gain is judged"),
    "benefit_retry_s": (float, "seconds a --min-gain verdict stands before the queue may try one more worker"),
    "min_work_per_load": (
        float,
        "a worker past the first only while each would get this many times its load time of work (0: off)",
    ),
    "chain_horizon_s": (
        float,
        "a family grows on the work upstream of it on its GPU while each worker would get this many seconds of it",
    ),
}


def parse_args(argv: list[str] | None, prog: str | None = None) -> argparse.Namespace:
    defaults = AutoscalePolicy()
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--gpus", type=parse_gpus, help="GPU indices to supervise, e.g. 0,1 (default: all)")
    for name, (kind, text) in POLICY_FLAGS.items():
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            default=None,
            help=f"{text} (default: `autoscale: {{{name}: …}}` in --config, else {getattr(defaults, name)})",
        )
    p.add_argument("--tick-s", type=float, default=2.0, help="seconds between readings")
    p.add_argument("--stop-grace-s", type=float, default=600.0, help="SIGTERM to SIGKILL, for stopping workers")
    p.add_argument("--cpu-workers", type=int, default=1, help="stand-in gpu0 workers when there is no GPU")
    p.add_argument("--fake-gpu", metavar="LEDGER", help=f"a fake GPU ledger instead of NVML (else ${LEDGER_ENV})")
    p.add_argument("--log-dir", type=Path, help="one log file per worker here (default: this program's output)")
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics (tasks/observe/metrics.py) here; 0: a free port"
    )
    p.add_argument("--metrics-addr", default="127.0.0.1", help="the metrics' address (0.0.0.0 for a remote Prometheus)")
    add_config_argument(p)
    args = p.parse_args(argv)
    if args.tick_s <= 0 or args.cpu_workers < 1 or args.stop_grace_s < 0:
        p.error("--tick-s must be > 0, --cpu-workers >= 1 and --stop-grace-s >= 0")
    return args


def policy_from(args: argparse.Namespace, conf: Settings) -> AutoscalePolicy:
    """The settings file's `autoscale:` section, overridden by the flags given. Raises ValueError."""
    flags = {name: getattr(args, name) for name in POLICY_FLAGS if getattr(args, name) is not None}
    return AutoscalePolicy(**{**conf.autoscale, **flags})


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    conf = settings_from(args)
    try:
        args.policy = policy_from(args, conf)
    except ValueError as exc:
        return fail(str(exc))
    logging.basicConfig(level=conf.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fake = args.fake_gpu or os.environ.get(LEDGER_ENV)
    if fake and not Path(fake).is_file():
        return fail(
            f"no fake GPU ledger at {fake}; create one with tasks.gpu.FakeGpuLedger.create "
            f"or drop --fake-gpu / ${LEDGER_ENV}"
        )
    probe = open_probe(fake)
    base_env = {k: v for k, v in os.environ.items() if k not in (LEDGER_ENV, INDEX_ENV)}

    def env_for(gpu: int) -> dict[str, str]:
        return {**base_env, LEDGER_ENV: str(Path(fake).resolve()), INDEX_ENV: str(gpu)} if fake else base_env

    if probe.mode == "none":
        print(
            f"framefleet autoscaler: CPU mode ({getattr(probe, 'reason', 'no GPU')}): keeping "
            f"{args.cpu_workers} stand-in worker(s) for {conf.gpu_queue(0)} alive; no packing",
            flush=True,
        )
    else:
        found = [g.index for g in probe.gpus()]
        missing = sorted(set(args.gpus or []) - set(found))
        if missing:
            probe.close()
            return fail(f"--gpus names GPU(s) {missing}, but the {probe.mode} probe sees {found}")
        print(f"framefleet autoscaler: {probe.mode} mode, GPUs {args.gpus or found}", flush=True)
    signals: list[int] = []  # a handler only appends: locks taken in a handler can deadlock

    def on_signal(signum: int, _frame: Any) -> None:
        signals.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    supervisor = Supervisor(lambda gpu, name: family_argv(conf, gpu, name), env_for, args.log_dir, args.stop_grace_s)
    settings_dir = args.log_dir / "settings" if args.log_dir else None  # files of the runs' other settings
    autoscaler = Autoscaler(
        conf, args.policy, probe, supervisor, args.gpus, args.cpu_workers, settings_dir=settings_dir
    )
    exporter = None
    if args.metrics_port is not None:
        exporter = start_exporter(args.metrics_port, conf, args.metrics_addr, open_probe(fake))
        print(f"framefleet autoscaler: metrics at {exporter.url}", flush=True)
    try:
        while not signals:
            autoscaler.tick()
            next_tick = time.monotonic() + args.tick_s
            while not signals and time.monotonic() < next_tick:
                time.sleep(min(0.1, args.tick_s))
        print("framefleet autoscaler: stopping every worker (warm shutdown; a second signal kills them)", flush=True)
    finally:
        supervisor.stop_all(args.stop_grace_s, lambda: len(signals) > 1)
        autoscaler.shutdown()
        probe.close()
        if exporter is not None:
            exporter.stop()
    print("framefleet autoscaler: all workers stopped", flush=True)
    return 0

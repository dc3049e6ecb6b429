"""Supervise this host's solo GPU workers: one per GPU, more while backlog and memory allow, fewer on pressure.

    framefleet autoscale [--gpus all|0,1] [--max-workers-per-gpu N] [--headroom-mib M]
                             [--tick-s S] [--cpu-workers N] [--config FILE] [--fake-gpu LEDGER]

Every tick it reads NVML (or a fake GPU ledger), the worker registry, queue backlogs, host RAM and
the OOM records (ff:oom), decides per GPU (worker_config.autoscale) and acts by starting a worker or
warm-stopping the newest. Each change is logged, sent as a Celery event (autoscale-up,
autoscale-down, autoscale-restart) and appended to the Redis list ff:autoscale. Without a readable
GPU it runs --cpu-workers stand-in workers for gpu0 and only keeps them alive. SIGINT or SIGTERM
warm-stops every worker (SIGKILL after --stop-grace-s) and exits 0; a second signal kills at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tasks.cli import common as _cli
from tasks.cli.common import parse_gpus
from tasks.fake_gpu import INDEX_ENV, LEDGER_ENV
from tasks.gpu_probe import GpuProbe, GpuReading, open_probe
from tasks.metrics import start_exporter
from tasks.oom import OOM_KEY
from tasks.redis_client import get_redis
from tasks.registry import live_workers
from tasks.supervisor import Slot, Supervisor, worker_argv
from worker_config import profiles
from worker_config.autoscale import AutoscalePolicy, Decision, GpuView, decide
from worker_config.settings import Settings

log = logging.getLogger("framefleet.autoscaler")
DECISIONS_KEY = "ff:autoscale"
DECISIONS_KEPT = 1000
POLICY_FLAGS = {  # AutoscalePolicy field: (type, help)
    "max_workers_per_gpu": (int, "at most this many workers on one GPU"),
    "min_workers_per_gpu": (int, "at least this many workers on each GPU"),
    "headroom_mib": (float, "GPU memory kept free beyond the workers' learned peaks"),
    "pressure_free_mib": (float, "below this much free GPU memory, one worker is stopped"),
    "cooldown_s": (float, "seconds between changes"),
    "idle_scale_down_s": (float, "seconds without work before a GPU goes down to its minimum"),
    "host_margin_mib": (float, "host RAM to leave free beyond another worker's RSS"),
}
EVENT_RESERVED = {"type", "hostname", "utcoffset", "pid", "clock", "timestamp"}


@dataclass
class Snapshot:
    """One tick's readings of everything but the GPU-specific decision."""

    gpus: list[GpuReading]
    used_mib: dict[tuple[int, int], float]  # (pid, gpu) -> MiB
    workers: dict[int, dict[str, Any]]  # pid -> registry state, this host's supervised workers only
    backlog: dict[int, int]
    host_free_mib: float
    ooms: list[dict[str, Any]]


class Autoscaler:
    """One host's autoscaler; ``tick`` reads everything once and makes at most one change per GPU."""

    def __init__(self, conf: Settings, policy: AutoscalePolicy, probe: GpuProbe, supervisor: Supervisor,
                 gpus: list[int] | None = None, cpu_workers: int = 1,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.conf, self.policy, self.probe, self.supervisor = conf, policy, probe, supervisor
        self.gpus, self.cpu_workers, self.clock, self.wall = gpus, cpu_workers, clock, wall
        self.r = get_redis(conf.redis_url)
        self.broker = get_redis(conf.broker)
        self.host = socket.gethostname()
        self.started_wall = wall()
        self.last_change: dict[int, float] = {}
        self.last_oom: dict[int, float] = {}
        self.last_raise: dict[int, float] = {}
        self.idle_since: dict[int, float] = {}
        self.last_stop_wall: dict[int, float] = {}
        self.last_hold: dict[int, str] = {}
        self._seen_ooms: set[str] = set()
        self._dispatcher: Any = None

    def tick(self) -> list[Decision]:
        """Reap and restart workers, then decide and act for every GPU; return this tick's decisions."""
        for what, slot, detail in self.supervisor.reap():
            self._on_process_event(what, slot, detail)
        if self.probe.mode == "none":
            return self._keep_cpu_workers()
        try:
            snap = self._snapshot()
        except Exception as exc:  # Redis or GPU unreadable: keep supervising, decide next tick
            log.warning("no decisions this tick: %s: %s", type(exc).__name__, exc)
            return []
        decisions = []
        for gpu in snap.gpus:
            try:
                decision = self._decide(gpu, snap)
                self._act(gpu.index, decision)
                decisions.append(decision)
            except Exception:  # one GPU's trouble never stops the others
                log.exception("GPU %d: tick failed", gpu.index)
        return decisions

    def shutdown(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.close()
            self._dispatcher = None

    def _snapshot(self) -> Snapshot:
        gpus = [g for g in self.probe.gpus() if self.gpus is None or g.index in self.gpus]
        used = {(p.pid, p.gpu): p.used_mib for p in self.probe.processes()}
        ours = {s.pid for s in self.supervisor.slots if s.pid is not None}
        workers = {int(w["pid"]): w for w in live_workers(self.r) if w.get("pid") in ours}
        pipe = self.broker.pipeline()
        for gpu in gpus:
            pipe.llen(self.conf.gpu_queue(gpu.index))
        backlog = dict(zip([g.index for g in gpus], pipe.execute(), strict=True))
        return Snapshot(gpus, used, workers, backlog, host_available_mib(), self._new_ooms())

    def _new_ooms(self) -> list[dict[str, Any]]:
        raws = self.r.lrange(OOM_KEY, 0, -1)
        fresh = []
        for raw in raws:
            if raw in self._seen_ooms:
                continue
            try:
                record = json.loads(raw)
                mine = int(record.get("pid", -1)) in self.supervisor.started_pids or \
                    str(record.get("worker", "")).rpartition("@")[2] == self.host
                if mine and float(record.get("time", 0)) >= self.started_wall:
                    fresh.append(record)
            except (ValueError, TypeError, AttributeError):
                log.warning("ignoring an unreadable %s record: %r", OOM_KEY, raw)
        self._seen_ooms = set(raws)
        return fresh

    def _decide(self, gpu: GpuReading, snap: Snapshot) -> Decision:
        now, idx, policy = self.clock(), gpu.index, self.policy
        key = profiles.key_for(self.conf, gpu.name, self.conf.hosted_stages())
        active, stopping = self.supervisor.active(idx), self.supervisor.stopping(idx)
        mine = [s for s in active + stopping if s.pid is not None]
        for slot in mine:
            self._learn(slot, snap, key)
        for record in (r for r in snap.ooms if int(r.get("gpu", -1)) == idx):
            self._on_oom(idx, record, key, bool(stopping))
        registered = [s for s in active if s.pid in snap.workers]
        ours_used = sum(self._memory_of(s, snap) for s in mine)
        busy = any(snap.workers[s.pid].get("busy") for s in registered if s.pid is not None)
        if snap.backlog[idx] == 0 and not busy:
            self.idle_since.setdefault(idx, now)
        else:
            self.idle_since.pop(idx, None)
        rss = [rss_mib(s.pid) for s in registered if s.pid is not None]
        profile = profiles.load(self.r, key)
        view = GpuView(
            index=idx, name=gpu.name, total_mib=gpu.total_mib, used_mib=gpu.used_mib, free_mib=gpu.free_mib,
            other_used_mib=max(0.0, gpu.used_mib - ours_used), workers=len(registered),
            starting=len(active) - len(registered), backlog=snap.backlog[idx],
            peak_mib=profile.peak_mib if profile else None, host_free_mib=snap.host_free_mib,
            worker_rss_mib=max(rss, default=0.0),
            recent_oom=now - self.last_oom.get(idx, -float("inf")) < policy.oom_recent_s,
            backlog_empty_for_s=now - self.idle_since.get(idx, now), stopping=len(stopping),
        )
        return decide(view, policy, now - self.last_change.get(idx, -float("inf")))

    @staticmethod
    def _memory_of(slot: Slot, snap: Snapshot) -> float:
        """The worker's GPU memory (MiB): as NVML or the ledger sees its pid, else as it publishes it
        (a container without the host's pid namespace hides the pid from NVML)."""
        seen = snap.used_mib.get((slot.pid or -1, slot.gpu))
        if seen is not None:
            return seen
        return float((snap.workers.get(slot.pid or -1) or {}).get("gpu_used_mib") or 0.0)

    def _learn(self, slot: Slot, snap: Snapshot, key: str) -> None:
        """Fold this worker's memory into the profile once it has run a task (its peak includes activations)."""
        assert slot.pid is not None
        seen = snap.used_mib.get((slot.pid, slot.gpu))
        slot.seen_peak_mib = max(slot.seen_peak_mib, seen or 0.0)
        state = snap.workers.get(slot.pid)
        if state is None or int(state.get("tasks_done") or 0) < 1:
            return
        # NVML's reading holds the CUDA context and the allocator's cache (which keeps its high-water
        # mark); the published peak catches an activation between two readings.
        peak = max(slot.seen_peak_mib, float(state.get("gpu_peak_mib") or 0.0))
        if peak > slot.learned_mib:
            slot.learned_mib = peak
            stored = profiles.learn(self.r, key, peak)
            log.info("GPU %d: %s peaked at %.0f MiB; profile %r: %.0f MiB", slot.gpu, slot.name, peak, key,
                     stored.peak_mib)

    def _on_oom(self, idx: int, record: dict[str, Any], key: str, stopping: bool) -> None:
        now = self.clock()
        self.last_oom[idx] = now
        observed = float(record.get("peak_mib") or 0.0)
        # OOMs while a worker is leaving, within a cooldown of its leaving (a record is written after
        # the failed allocation, and after a garbage collection), or just after a raise, come from the
        # crowding already answered: they must not raise the peak again.
        settled = self.last_stop_wall.get(idx, -float("inf")) + self.policy.cooldown_s
        stale = stopping or float(record.get("time", 0)) <= settled
        if stale or now - self.last_raise.get(idx, -float("inf")) < self.policy.cooldown_s:
            log.warning("GPU %d: OOM in %s (%s, %.0f MiB); profile already raised", idx,
                        record.get("worker"), record.get("stage"), observed)
            return
        self.last_raise[idx] = now
        stored = profiles.raise_after_oom(self.r, key, observed)
        log.warning("GPU %d: OOM in %s (%s, %.0f MiB): profile %r raised to %.0f MiB", idx,
                    record.get("worker"), record.get("stage"), observed, key, stored.peak_mib)

    def _act(self, idx: int, decision: Decision) -> None:
        if decision.action == "hold":
            kind = re.sub(r"[-\d.]+", "#", decision.reason)
            if self.last_hold.get(idx) != kind:
                log.info("GPU %d: hold: %s %s", idx, decision.reason, json.dumps(decision.readings))
                self.last_hold[idx] = kind
            return
        self.last_hold.pop(idx, None)
        if decision.action == "up":
            slot: Slot | None = self.supervisor.start(idx, self.conf.gpu_queue(idx))
        else:
            slot = self.supervisor.stop_newest(idx)
        self.last_change[idx] = self.clock()
        self._announce(decision.action, idx, decision.reason, decision.readings, slot)

    def _keep_cpu_workers(self) -> list[Decision]:
        decisions = []
        while len(self.supervisor.active(0)) < self.cpu_workers:
            have = len(self.supervisor.active(0))
            decision = Decision("up", f"CPU mode: {have} of {self.cpu_workers} stand-in worker(s) for gpu0",
                                {"gpu": 0, "mode": "cpu", "workers": have, "cpu_workers": self.cpu_workers})
            slot = self.supervisor.start(0, self.conf.gpu_queue(0))
            self._announce("up", 0, decision.reason, decision.readings, slot)
            decisions.append(decision)
        return decisions

    def _on_process_event(self, what: str, slot: Slot, detail: str) -> None:
        if what in ("exited", "killed"):
            log.warning("GPU %d: worker %s %s", slot.gpu, slot.name, detail)
        elif what == "stopped":
            self.last_stop_wall[slot.gpu] = self.wall()
            log.info("GPU %d: worker %s stopped (%s)", slot.gpu, slot.name, detail)
        else:
            self._announce("restart", slot.gpu, f"{slot.name} {slot.last_exit.split(';')[0]}; restarted",
                           {"gpu": slot.gpu, "failures": slot.failures}, slot)

    def _announce(self, action: str, idx: int, reason: str, readings: dict[str, Any], slot: Slot | None) -> None:
        """Log a change, append it to ff:autoscale and send it as the event autoscale-<action>."""
        record = {**readings, "gpu": idx, "action": action, "reason": reason, "time": self.wall(),
                  "host": self.host, "worker": slot.name if slot else None,
                  "worker_pid": slot.pid if slot else None}
        log.info("GPU %d: %s (%s): %s %s", idx, action, record["worker"], reason, json.dumps(readings))
        try:
            pipe = self.r.pipeline()
            pipe.rpush(DECISIONS_KEY, json.dumps(record))
            pipe.ltrim(DECISIONS_KEY, -DECISIONS_KEPT, -1)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("decision not recorded in %s: %s", DECISIONS_KEY, exc)
        try:
            if self._dispatcher is None:
                from tasks import app

                self._dispatcher = app.events.Dispatcher(app.connection_for_write(),
                                                         hostname=f"autoscaler@{self.host}", enabled=True)
            self._dispatcher.send(f"autoscale-{action}",
                                  **{k: v for k, v in record.items() if k not in EVENT_RESERVED})
        except Exception as exc:
            log.warning("autoscale-%s event not sent: %s", action, exc)
            self._dispatcher = None


def host_available_mib() -> float:
    """MemAvailable from /proc/meminfo in MiB (inf where there is no /proc/meminfo)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def parse_args(argv: list[str] | None, prog: str | None = None) -> argparse.Namespace:
    defaults = AutoscalePolicy()
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=_cli.HelpFormatter)
    p.add_argument("--gpus", type=parse_gpus, help="GPU indices to supervise, e.g. 0,1 (default: all)")
    for name, (kind, text) in POLICY_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                       help=f"{text} (default: `autoscale: {{{name}: …}}` in --config, else {getattr(defaults, name)})")
    p.add_argument("--tick-s", type=float, default=2.0, help="seconds between readings")
    p.add_argument("--stop-grace-s", type=float, default=600.0, help="SIGTERM to SIGKILL, for stopping workers")
    p.add_argument("--cpu-workers", type=int, default=1, help="stand-in gpu0 workers when there is no GPU")
    p.add_argument("--fake-gpu", metavar="LEDGER", help=f"a fake GPU ledger instead of NVML (else ${LEDGER_ENV})")
    p.add_argument("--log-dir", type=Path, help="one log file per worker here (default: this program's output)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics (tasks/metrics.py) here; 0: a free port")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="the metrics' address (0.0.0.0 for a remote Prometheus)")
    _cli.add_config_argument(p)
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
    conf = _cli.settings_from(args)
    try:
        args.policy = policy_from(args, conf)
    except ValueError as exc:
        return _cli.fail(str(exc))
    logging.basicConfig(level=conf.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fake = args.fake_gpu or os.environ.get(LEDGER_ENV)
    if fake and not Path(fake).is_file():
        return _cli.fail(f"no fake GPU ledger at {fake}; create one with tasks.fake_gpu.FakeGpuLedger.create "
                         f"or drop --fake-gpu / ${LEDGER_ENV}")
    probe = open_probe(fake)
    base_env = {k: v for k, v in os.environ.items() if k not in (LEDGER_ENV, INDEX_ENV)}

    def env_for(gpu: int) -> dict[str, str]:
        return {**base_env, LEDGER_ENV: str(Path(fake).resolve()), INDEX_ENV: str(gpu)} if fake else base_env

    if probe.mode == "none":
        print(f"framefleet autoscaler: CPU mode ({getattr(probe, 'reason', 'no GPU')}): keeping "
              f"{args.cpu_workers} stand-in worker(s) for {conf.gpu_queue(0)} alive; no packing", flush=True)
    else:
        found = [g.index for g in probe.gpus()]
        missing = sorted(set(args.gpus or []) - set(found))
        if missing:
            probe.close()
            return _cli.fail(f"--gpus names GPU(s) {missing}, but the {probe.mode} probe sees {found}")
        print(f"framefleet autoscaler: {probe.mode} mode, GPUs {args.gpus or found}", flush=True)
    signals: list[int] = []  # a handler only appends: locks taken in a handler can deadlock

    def on_signal(signum: int, _frame: Any) -> None:
        signals.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    supervisor = Supervisor(lambda gpu, name: worker_argv(conf.gpu_queue(gpu), name), env_for, args.log_dir,
                            args.stop_grace_s)
    autoscaler = Autoscaler(conf, args.policy, probe, supervisor, args.gpus, args.cpu_workers)
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
        print("framefleet autoscaler: stopping every worker (warm shutdown; a second signal kills them)",
              flush=True)
    finally:
        supervisor.stop_all(args.stop_grace_s, lambda: len(signals) > 1)
        autoscaler.shutdown()
        probe.close()
        if exporter is not None:
            exporter.stop()
    print("framefleet autoscaler: all workers stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

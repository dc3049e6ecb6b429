"""The autoscaler of one host: each tick it reads the GPUs, the workers, the backlogs and the OOM records,
decides per worker family (tasks.autoscaler.policy) and, on each GPU, starts the workers that fit (all at
once, once a peak is known) or warm-stops one.

Each change is logged, sent as a Celery event (autoscale-up, autoscale-down, autoscale-restart)
and appended to the Redis list ff:autoscale.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tasks import keys
from tasks.autoscaler import profiles
from tasks.autoscaler.benefit import Benefit
from tasks.autoscaler.chain import learn_first, leave_room, one_change
from tasks.autoscaler.families import Family, families
from tasks.autoscaler.policy import AutoscalePolicy, Decision, GpuView, decide
from tasks.autoscaler.run_settings import FamilyBook
from tasks.autoscaler.supervisor import Slot, Supervisor
from tasks.delivery import settings_queues
from tasks.delivery.queues import lengths as queue_lengths
from tasks.gpu import GpuProbe, GpuReading
from tasks.keys import OOM_LOG as OOM_KEY
from tasks.redis_client import get_redis
from tasks.workers.registry import live_workers
from worker_config.settings import CONFIG_ENV, Settings

log = logging.getLogger("framefleet.autoscaler")
DECISIONS_KEY = keys.AUTOSCALE_LOG
DECISIONS_KEPT = 1000
EVENT_RESERVED = {"type", "hostname", "utcoffset", "pid", "clock", "timestamp"}


@dataclass
class Snapshot:
    """One tick's readings of everything but the GPU-specific decision."""

    gpus: list[GpuReading]
    used_mib: dict[tuple[int, int], float]  # (pid, gpu) -> MiB
    workers: dict[int, dict[str, Any]]  # pid -> registry state, this host's supervised workers only
    backlog: dict[str, int]  # queue (and settings queue) -> tasks waiting
    host_free_mib: float
    ooms: list[dict[str, Any]]


class Autoscaler:
    """One host's autoscaler; ``tick`` reads everything once and makes at most one change per GPU.

    Each GPU's workers come in families, one per queue (``families``), each scaled by its own
    backlog and its own learned peak, and by the work upstream of it on the GPU (the tasks of the
    families of earlier stages, which will reach it) times its learned seconds per task; the cooldown
    and the one change per tick are per GPU. Tasks waiting in a settings queue that no live worker
    consumes (their run's settings are not this autoscaler's) get a family of their own, started from
    the run's recorded settings (tasks.autoscaler.run_settings) and scaled like the others down to none
    once idle.
    """

    def __init__(
        self,
        conf: Settings,
        policy: AutoscalePolicy,
        probe: GpuProbe,
        supervisor: Supervisor,
        gpus: list[int] | None = None,
        cpu_workers: int = 1,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        settings_dir: Path | None = None,
    ) -> None:
        self.conf, self.policy, self.probe, self.supervisor = conf, policy, probe, supervisor
        self.gpus, self.cpu_workers, self.clock, self.wall = gpus, cpu_workers, clock, wall
        self.r = get_redis(conf.redis_url)
        self.broker = get_redis(conf.broker)
        self.host = socket.gethostname()
        self.started_wall = wall()
        self.last_change: dict[int, float] = {}  # per GPU
        self.last_oom: dict[int, float] = {}  # per GPU
        self.last_oom_queue: dict[int, str] = {}  # per GPU: the family whose task ran out of memory last
        self.last_stop_wall: dict[int, float] = {}  # per GPU
        self.last_raise: dict[str, float] = {}  # per family (queue)
        self.idle_since: dict[str, float] = {}  # per family
        self.last_hold: dict[str, str] = {}  # per family
        # per family: pid -> (busy s, tasks done) as each of its workers last published them, kept after it exits
        self.served: dict[str, dict[int, tuple[float, int]]] = {}
        self.benefit: dict[str, Benefit] = {}  # per family: its throughput trials
        self.busy: dict[int, deque[tuple[float, float]]] = {}  # per GPU: (time, NVML utilisation %) readings
        self._seen_ooms: set[str | bytes] = set()
        self._dispatcher: Any = None
        self.book = FamilyBook(conf, self.r, self.broker, settings_dir)

    def tick(self) -> list[Decision]:
        """Reap and restart workers, then decide for every family of every GPU and make at most one
        change per GPU; return this tick's decisions (one per family)."""
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
                decisions += self._tick_gpu(gpu, snap)
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
        live = live_workers(self.r)
        workers = {int(w["pid"]): w for w in live if w.get("pid") in ours}
        waiting = settings_queues.unconsumed(self.r, self.broker, live)
        for g in gpus:
            self.book.adopt(g.index, waiting)
        queues = [q for g in gpus for f in self.book.of(g.index) for q in (f.queue, *f.settings_queues)]
        backlog = queue_lengths(self.broker, queues)
        return Snapshot(gpus, used, workers, backlog, host_available_mib(), self._new_ooms())

    def _new_ooms(self) -> list[dict[str, Any]]:
        raws = self.r.lrange(OOM_KEY, 0, -1)
        fresh = []
        for raw in raws:
            if raw in self._seen_ooms:
                continue
            try:
                record = json.loads(raw)
                mine = (
                    int(record.get("pid", -1)) in self.supervisor.started_pids
                    or str(record.get("worker", "")).rpartition("@")[2] == self.host
                )
                if mine and float(record.get("time", 0)) >= self.started_wall:
                    fresh.append(record)
            except (ValueError, TypeError, AttributeError):
                log.warning("ignoring an unreadable %s record: %r", OOM_KEY, raw)
        self._seen_ooms = set(raws)
        return fresh

    def _tick_gpu(self, gpu: GpuReading, snap: Snapshot) -> list[Decision]:
        """Learn, decide for each family of ``gpu``, and act on at most one of the decisions."""
        idx, fams = gpu.index, self.book.of(gpu.index)
        keys = {f.key: profiles.key_for(f.conf or self.conf, gpu.name, f.stages) for f in fams}
        stopping = bool(self.supervisor.stopping(idx))
        for f in fams:
            for slot in self.supervisor.active(idx, f.key) + self.supervisor.stopping(idx, f.key):
                if slot.pid is not None:
                    self._learn(slot, snap, keys[f.key])
                    self._note_service(f.key, slot.pid, snap)
        self._observe_benefit(gpu, snap, fams)
        for record in (r for r in snap.ooms if int(r.get("gpu", -1)) == idx):
            family = self._family_of(record, fams)
            self._on_oom(idx, family.key, record, keys[family.key], stopping)
        views = self._views(gpu, snap, fams, keys)
        since = self.clock() - self.last_change.get(idx, -float("inf"))
        decisions = [
            decide(view, self.book.policy_for(f, self.policy), since) for f, view in zip(fams, views, strict=True)
        ]
        decisions = learn_first(views, decisions, self.policy)
        chosen = one_change(views, decisions, self.policy, self.last_oom_queue.get(idx))
        if chosen is not None:  # a scale-up of several leaves room for the workers other families get first
            decisions[chosen] = leave_room(views, decisions, chosen, self.book.policy_for(fams[chosen], self.policy))
        for i, (family, decision) in enumerate(zip(fams, decisions, strict=True)):
            if decision.action != "hold" and i != chosen:
                # one change per GPU per tick: the others are decided afresh next tick
                decisions[i] = Decision(
                    "hold",
                    f"{fams[chosen or 0].key} changes first this tick; then: {decision.reason}",
                    decision.readings,
                )
            self._act(family, decisions[i])
        for key in self.book.forget_idle(idx, self.supervisor, snap.backlog):
            self.idle_since.pop(key, None)
        return decisions

    def _observe_benefit(self, gpu: GpuReading, snap: Snapshot, fams: list[Family]) -> None:
        """Keep the GPU's utilisation over the policy's window and each family's throughput trial; log a verdict."""
        now, window = self.clock(), self.busy.setdefault(gpu.index, deque())
        window.append((now, gpu.utilization_pct))
        while window and window[0][0] < now - self.policy.busy_window_s:
            window.popleft()
        p = self.policy
        for f in fams:
            pids = {s.pid for s in self.supervisor.active(gpu.index, f.key) if s.pid in snap.workers}
            trials = self.benefit.setdefault(f.key, Benefit(p.min_gain, p.trial_tasks, p.benefit_retry_s))
            verdict = trials.observe(self.served.get(f.key, {}), {pid for pid in pids if pid is not None}, now)
            if verdict:
                busy = sum(u for _, u in window) / len(window)
                log.info("GPU %d: %s: %s (GPU %.0f %% busy)", gpu.index, f.key, verdict, busy)

    def _views(self, gpu: GpuReading, snap: Snapshot, fams: list[Family], keys: dict[str, str]) -> list[GpuView]:
        """One GpuView per family; each counts the other families' workers as used memory, and the tasks
        waiting in or held by the families of earlier stages as work upstream of it."""
        now, idx = self.clock(), gpu.index
        active = {f.key: self.supervisor.active(idx, f.key) for f in fams}
        stopping = {f.key: self.supervisor.stopping(idx, f.key) for f in fams}
        measured = {
            q: sum(self._memory_of(s, snap) for s in active[q] + stopping[q] if s.pid is not None) for q in active
        }
        peaks = {q: (p.peak_mib if (p := profiles.load_or_seed(self.r, keys[q])) else None) for q in active}
        # Another family's workers may sit below their peak right now (between tasks, or loading):
        # reserve at least their learned peaks, so that this family does not take their activations.
        reserved = {q: max(measured[q], (len(active[q]) + len(stopping[q])) * (peaks[q] or 0.0)) for q in active}
        foreign = max(0.0, gpu.used_mib - sum(measured.values()))
        recent_oom = now - self.last_oom.get(idx, -float("inf")) < self.policy.oom_recent_s
        waiting = {f.key: self.book.backlog(f, snap.backlog) for f in fams}
        held = {
            q: sum(1 for s in active[q] + stopping[q] if (snap.workers.get(s.pid or -1) or {}).get("busy"))
            for q in active
        }
        upstream = {f.key: sum(waiting[g.key] + held[g.key] for g in fams if g.position < f.position) for f in fams}
        served = {q: self.service_s(q) for q in active}
        loads = {q: load_s(active[q], snap.workers, self.supervisor.clock()) for q in active}
        # Until a family has ended a task, assume it as slow as the slowest that has: the others leave room
        # for it (leave_room) rather than count it as free, and it grows on its own time once known.
        slowest = max((s for s in served.values() if s is not None), default=None)
        window = self.busy.get(idx) or deque([(now, gpu.utilization_pct)])
        busy_pct = sum(u for _, u in window) / len(window)
        views = []
        for f in fams:
            q, backlog = f.key, waiting[f.key]
            registered = [s for s in active[q] if s.pid in snap.workers]
            busy = any(snap.workers[s.pid].get("busy") for s in registered if s.pid is not None)
            if backlog == 0 and not busy and upstream[q] == 0:  # nothing waits for it, here or upstream
                self.idle_since.setdefault(q, now)
            else:
                self.idle_since.pop(q, None)
            rss = [rss_mib(s.pid) for s in registered if s.pid is not None]
            views.append(
                GpuView(
                    index=idx,
                    name=gpu.name,
                    total_mib=gpu.total_mib,
                    used_mib=gpu.used_mib,
                    free_mib=gpu.free_mib,
                    other_used_mib=foreign + sum(reserved[o] for o in reserved if o != q),
                    workers=len(registered),
                    starting=len(active[q]) - len(registered),
                    backlog=backlog,
                    peak_mib=peaks[q],
                    host_free_mib=snap.host_free_mib,
                    worker_rss_mib=max(rss, default=0.0),
                    recent_oom=recent_oom,
                    backlog_empty_for_s=now - self.idle_since.get(q, now),
                    stopping=len(stopping[q]),
                    queue=q,
                    upstream=upstream[q],
                    service_s=served[q] or slowest,
                    service_assumed=served[q] is None and slowest is not None,
                    running=held[q],
                    load_s=loads[q],
                    busy_pct=busy_pct,
                    ceiling=(trials := self.benefit.get(q) or Benefit()).ceiling,
                    trial=trials.trial,
                    verdict=trials.verdict,
                    others_waiting=sum(waiting[o.key] for o in fams if o.key != q),
                )
            )
        return views

    def service_s(self, family: str) -> float | None:
        """Mean seconds per task of ``family``'s workers over every task they have ended (None before the first)."""
        seen = self.served.get(family, {}).values()
        tasks = sum(n for _, n in seen)
        return sum(s for s, _ in seen) / tasks if tasks else None

    def _note_service(self, family: str, pid: int, snap: Snapshot) -> None:
        """Keep the busy seconds and tasks that worker ``pid`` last published (workers that do not publish
        ``busy_s`` count for nothing)."""
        state = snap.workers.get(pid) or {}
        if state.get("busy_s") is not None and int(state.get("tasks_done") or 0) > 0:
            self.served.setdefault(family, {})[pid] = (float(state["busy_s"]), int(state["tasks_done"]))

    def _family_of(self, record: dict[str, Any], fams: list[Family]) -> Family:
        """The family whose task wrote this OOM record: by its worker's pid, else by its stage."""
        slot = next((s for s in self.supervisor.slots if s.pid == record.get("pid")), None)
        by_pid = [f for f in fams if slot is not None and f.key == slot.queue]
        by_stage = [f for f in fams if record.get("stage") in f.stages]
        return (by_pid or by_stage or fams)[0]

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
            log.info(
                "GPU %d: %s peaked at %.0f MiB; profile %r: %.0f MiB", slot.gpu, slot.name, peak, key, stored.peak_mib
            )

    def _on_oom(self, idx: int, queue: str, record: dict[str, Any], key: str, stopping: bool) -> None:
        now = self.clock()
        self.last_oom[idx], self.last_oom_queue[idx] = now, queue
        observed = float(record.get("peak_mib") or 0.0)
        # OOMs while a worker is leaving, within a cooldown of its leaving (a record is written after
        # the failed allocation, and after a garbage collection), or just after a raise, come from the
        # crowding already answered: they must not raise the peak again.
        settled = self.last_stop_wall.get(idx, -float("inf")) + self.policy.cooldown_s
        stale = stopping or float(record.get("time", 0)) <= settled
        if stale or now - self.last_raise.get(queue, -float("inf")) < self.policy.cooldown_s:
            log.warning(
                "GPU %d: OOM in %s (%s, %.0f MiB); profile already raised",
                idx,
                record.get("worker"),
                record.get("stage"),
                observed,
            )
            return
        self.last_raise[queue] = now
        stored = profiles.raise_after_oom(self.r, key, observed)
        log.warning(
            "GPU %d: OOM in %s (%s, %.0f MiB): profile %r raised to %.0f MiB",
            idx,
            record.get("worker"),
            record.get("stage"),
            observed,
            key,
            stored.peak_mib,
        )

    def _act(self, family: Family, decision: Decision) -> None:
        idx, queue = family.gpu, family.key
        if decision.action == "hold":
            kind = re.sub(r"[-\d.]+", "#", decision.reason)
            if self.last_hold.get(queue) != kind:
                log.info("GPU %d: %s: hold: %s %s", idx, queue, decision.reason, json.dumps(decision.readings))
                self.last_hold[queue] = kind
            return
        self.last_hold.pop(queue, None)
        self.last_change[idx] = self.clock()
        if decision.action == "down":
            slot = self.supervisor.stop_newest(idx, queue)
            self._announce(decision.action, idx, decision.reason, decision.readings, slot)
            return
        for _ in range(decision.count):  # the policy counted each of them against the live reading
            env = {CONFIG_ENV: family.config} if family.config else None
            self._announce("up", idx, decision.reason, decision.readings, self.supervisor.start(idx, queue, env))

    def _keep_cpu_workers(self) -> list[Decision]:
        decisions = []
        for family in families(self.conf, 0):
            while len(self.supervisor.active(0, family.queue)) < self.cpu_workers:
                have = len(self.supervisor.active(0, family.queue))
                decision = Decision(
                    "up",
                    f"CPU mode: {have} of {self.cpu_workers} stand-in worker(s) for {family.queue}",
                    {"gpu": 0, "queue": family.queue, "mode": "cpu", "workers": have, "cpu_workers": self.cpu_workers},
                )
                slot = self.supervisor.start(0, family.queue)
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
            self._announce(
                "restart",
                slot.gpu,
                f"{slot.name} {slot.last_exit.split(';')[0]}; restarted",
                {"gpu": slot.gpu, "failures": slot.failures},
                slot,
            )

    def _announce(self, action: str, idx: int, reason: str, readings: dict[str, Any], slot: Slot | None) -> None:
        """Log a change, append it to ff:autoscale and send it as the event autoscale-<action>."""
        record = {
            **readings,
            "gpu": idx,
            "action": action,
            "reason": reason,
            "time": self.wall(),
            "host": self.host,
            "worker": slot.name if slot else None,
            "worker_pid": slot.pid if slot else None,
        }
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

                self._dispatcher = app.events.Dispatcher(
                    app.connection_for_write(), hostname=f"autoscaler@{self.host}", enabled=True
                )
            self._dispatcher.send(f"autoscale-{action}", **{k: v for k, v in record.items() if k not in EVENT_RESERVED})
        except Exception as exc:
            log.warning("autoscale-%s event not sent: %s", action, exc)
            self._dispatcher = None


def load_s(slots: list[Slot], registered: Container[int], now: float) -> float | None:
    """The longest any of ``slots``' workers took from its start to its registration (its pid in ``registered``),
    a worker still loading counting the time it has taken by ``now``; None until one has registered. Notes each
    slot's time once it registers (a restart forgets it: tasks.autoscaler.supervisor)."""
    for s in slots:
        if s.loaded_s is None and s.pid in registered:
            s.loaded_s = now - s.started_at
    loaded = [s.loaded_s for s in slots if s.loaded_s is not None]
    loading = [now - s.started_at for s in slots if s.loaded_s is None and s.pid is not None]
    return max(loaded + loading) if loaded else None


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

"""Worker processes under supervision: started from argument lists, warm-stopped, restarted with backoff."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import EXIT_CANNOT_START

ROOT = Path(__file__).resolve().parents[2]
MAX_BACKOFF_S = 60.0
STABLE_RUN_S = 60.0  # a worker that ran this long before failing starts its backoff afresh


# The CPU stages run in solo workers too, one process per core, each supervised like a GPU worker.
# DESIGN promises CPU stages the GPU runtime: claims renewed, a deadline, published busy state,
# recycling. That runtime lives in the process that runs the task (the heartbeat thread renews
# the claims the task thread holds, ends the process at the deadline, publishes its state), so
# a prefork pool would split it across two processes: the parent would have to learn each
# child's claims and task by id over IPC, and could only enforce a deadline by killing a child
# it does not own. One solo process per core keeps one runtime for every worker, one code path,
# and the same supervisor restarting a recycled or killed process; it costs one broker
# connection and one registry entry per core.
CPU_GROUP = -1  # the supervisor's group of CPU workers; GPU groups are GPU indices


def cpu_worker_count() -> int:
    """One CPU worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def worker_argv(
    queue: str, name: str, pool: str = "solo", concurrency: int = 1, python: str | None = None
) -> list[str]:
    """The command of one framefleet worker: ``celery -A tasks worker -Q queue -n name@%h``.

    The app gives it the rest of the design (solo, one process, events, no gossip or mingle, INFO
    logs: tasks.workers.launch); ``-n`` tells apart the workers of one queue on this host.
    ``pool``/``concurrency``: another pool than one solo process (a CPU worker's). ``python``: the
    interpreter of a stage's own environment (default: this one).
    """
    argv = [python or sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", queue, "-n", f"{name}@%h"]
    if (pool, concurrency) != ("solo", 1):
        argv += ["-P", pool, "-c", str(concurrency)]
    return argv


@dataclass
class Slot:
    """One intended worker of a GPU's queue; its process is replaced when it exits, until the slot is stopped.

    ``queue``: the queue its worker consumes (``gpuN``, or ``gpuN.<stage>`` for a stage with its own
    python); the slots of one GPU and queue are one family, scaled together.
    """

    gpu: int
    seq: int
    name: str
    queue: str = ""
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    stopping_since: float | None = None
    last_exit: str = ""
    seen_peak_mib: float = 0.0
    loaded_s: float | None = None  # start to registration of its current process, once it registered
    learned_mib: float = 0.0
    env: dict[str, str] | None = None  # set over ``env_for``'s for this worker (a family's settings file)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None


class Supervisor:
    """Starts worker processes (argument lists, own session each), warm-stops them, restarts the fallen.

    ``argv_for(gpu, name)`` and ``env_for(gpu)`` build a worker's command and environment; a worker
    started by ``start(gpu, queue)`` is named ``<queue>-<n>`` (``queue_of`` reads the queue back);
    ``stop_grace_s``: seconds between SIGTERM (warm shutdown) and SIGKILL.
    """

    def __init__(
        self,
        argv_for: Callable[[int, str], list[str]],
        env_for: Callable[[int], dict[str, str]],
        log_dir: Path | None = None,
        stop_grace_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.argv_for, self.env_for, self.log_dir = argv_for, env_for, log_dir
        self.stop_grace_s, self.clock = stop_grace_s, clock
        self.slots: list[Slot] = []
        self.started_pids: set[int] = set()
        self._seq: dict[tuple[int, str], int] = {}

    def active(self, gpu: int, queue: str | None = None) -> list[Slot]:
        """The slots of ``gpu`` (of its ``queue`` only, when given) that are not stopping."""
        return [s for s in self._of(gpu, queue) if s.stopping_since is None]

    def stopping(self, gpu: int, queue: str | None = None) -> list[Slot]:
        """The slots of ``gpu`` (of its ``queue`` only, when given) told to stop and not gone yet."""
        return [s for s in self._of(gpu, queue) if s.stopping_since is not None]

    def start(self, gpu: int, queue: str, env: dict[str, str] | None = None) -> Slot:
        """Start a worker of ``gpu`` for ``queue`` (a family's key), named ``<queue>-<n>`` (n counts per GPU
        and queue); ``env``: set over ``env_for``'s, in this worker and its restarts."""
        seq = self._seq[gpu, queue] = self._seq.get((gpu, queue), 0) + 1
        slot = Slot(gpu, seq, f"{queue}-{seq}", queue, env=env)
        self.slots.append(slot)
        self._spawn(slot)
        return slot

    def stop_newest(self, gpu: int, queue: str | None = None) -> Slot | None:
        """Warm-stop the most recently added worker of ``gpu`` (of its ``queue``, when given); a slot
        waiting to restart just goes."""
        candidates = self.active(gpu, queue)
        if not candidates:
            return None
        slot = candidates[-1]  # slots are kept in the order they were added
        if slot.pid is None:
            self.slots.remove(slot)
        else:
            slot.stopping_since = self.clock()
            signal_group(slot.pid, signal.SIGTERM)
        return slot

    def reap(self) -> list[tuple[str, Slot, str]]:
        """Handle exits and due restarts; return (what, slot, detail) for each: restarted, stopped, killed."""
        now, happened = self.clock(), []
        for slot in list(self.slots):
            code = slot.proc.poll() if slot.proc is not None else None
            if slot.stopping_since is not None:
                if code is not None or slot.proc is None:
                    self.slots.remove(slot)
                    happened.append(("stopped", slot, f"exit status {code}"))
                elif now - slot.stopping_since > self.stop_grace_s:
                    signal_group(slot.proc.pid, signal.SIGKILL)
                    happened.append(("killed", slot, f"still running {self.stop_grace_s:g} s after SIGTERM"))
            elif code is not None:
                ran_s = now - slot.started_at
                slot.proc = None
                if code == 0:
                    slot.failures, slot.restart_at = 0, now  # recycled: replaced at once
                    detail = "exited 0 (recycled); starting a fresh one"
                elif code == EXIT_CANNOT_START:
                    slot.restart_at = None
                    detail = f"exited with status {code}: it cannot start here (its log says why); not restarted"
                else:
                    slot.failures = 1 if ran_s >= STABLE_RUN_S else slot.failures + 1
                    delay = min(MAX_BACKOFF_S, 2.0 ** (slot.failures - 1))
                    slot.restart_at = now + delay
                    detail = f"exited with status {code} after {ran_s:.1f} s; restarting in {delay:g} s"
                slot.last_exit = detail
                happened.append(("exited", slot, detail))
            if slot.proc is None and slot.restart_at is not None and now >= slot.restart_at:
                self._spawn(slot)
                happened.append(("restarted", slot, f"pid {slot.pid}"))
        return happened

    def stop_all(self, grace_s: float, hurry: Callable[[], bool] = lambda: False) -> None:
        """Warm-stop every worker, wait up to ``grace_s`` (or until ``hurry()``), then SIGKILL the rest."""
        running = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in running:
            signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in running) and time.monotonic() < deadline and not hurry():
            time.sleep(0.1)
        for proc in running:
            if proc.poll() is None:
                signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        self.slots.clear()

    def _of(self, gpu: int, queue: str | None) -> list[Slot]:
        return [s for s in self.slots if s.gpu == gpu and (queue is None or s.queue == queue)]

    def _spawn(self, slot: Slot) -> None:
        out: Any = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{slot.name}.log", "ab")  # noqa: SIM115 (the child keeps its own copy)
        try:
            slot.proc = subprocess.Popen(
                self.argv_for(slot.gpu, slot.name),
                env={**self.env_for(slot.gpu), **(slot.env or {})},
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()
        slot.started_at, slot.restart_at, slot.seen_peak_mib, slot.loaded_s = self.clock(), None, 0.0, None
        self.started_pids.add(slot.proc.pid)


def queue_of(name: str) -> str:
    """The queue of a worker that ``Supervisor.start`` named ``<queue>-<n>``."""
    return name.rpartition("-")[0] or name


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group of ``pid`` (each worker leads its own); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)

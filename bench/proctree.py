"""Run a command and measure its whole process tree: wall seconds, CPU-seconds and peak total RSS (MiB).

CPU-seconds come from two readings, and the larger is kept: the kernel's count for every
descendant that was waited for (``RUSAGE_CHILDREN``), and /proc samples of every process of
the tree (which also sees processes that are never waited for, at most one sample interval
short for each). This process becomes a child subreaper, so a grandchild whose parent exits
(a daemon, a Ray worker) stays in the tree instead of moving to init.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
TICK_S = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux only; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU-seconds, RSS bytes) of ``pid``, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    # Fields after the name: state(0) ppid(1) ... utime(11) stime(12) ... rss(21), in pages.
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK_S, int(fields[21]) * PAGE


def kind_of(pid: int) -> str:
    """A short name for what ``pid`` runs: the program, and a Celery worker's queues (``celery -Q gpu0``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return "?"
    names = [Path(w).name for w in words[:3]]
    program = next((n for n in names if not n.startswith("python")), names[0])
    if program == "-m" and len(words) > 2:  # python -m celery ...: the module
        program = words[2]
    if "flower" in words:
        program += " flower"
    if "-Q" in words[:-1]:
        program += " -Q " + words[words.index("-Q") + 1]
    return program


@dataclass
class TreeSample:
    """What the sampler saw of one process tree."""

    cpu_s: dict[int, float] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)  # pid -> what it is (see ``kind_of``)
    peak_rss_bytes: int = 0
    peak_processes: int = 0


class TreeSampler(threading.Thread):
    """Samples every ``interval_s`` the descendants of ``root`` (and root itself) from /proc."""

    def __init__(self, root: int, interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.root, self.interval_s = root, interval_s
        self.seen = TreeSample()
        self.halt = threading.Event()

    def sample(self) -> None:
        table = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (st := _stat(int(entry))) is not None:
                table[int(entry)] = st
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        tree, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            if pid in table:
                tree.append(pid)
                todo.extend(children.get(pid, ()))
        rss = 0
        for pid in tree:
            _, cpu, rss_bytes = table[pid]
            self.seen.cpu_s[pid] = max(cpu, self.seen.cpu_s.get(pid, 0.0))
            if pid not in self.seen.kinds:
                self.seen.kinds[pid] = kind_of(pid)
            rss += rss_bytes
        self.seen.peak_rss_bytes = max(self.seen.peak_rss_bytes, rss)
        self.seen.peak_processes = max(self.seen.peak_processes, len(tree))

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.interval_s)

    def stop(self) -> TreeSample:
        self.halt.set()
        self.join()
        return self.seen


@dataclass
class Measured:
    """A finished command: exit status, its output, wall seconds, CPU-seconds and peak total RSS (MiB)."""

    returncode: int
    stdout: str
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    peak_processes: int
    cpu_by_kind: dict[str, float] = field(default_factory=dict)  # sampled CPU-seconds per ``kind_of``


def _reap_orphans() -> None:
    """Wait for adopted orphans that have exited, so that RUSAGE_CHILDREN counts their CPU time."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def measure(argv: list[str], env: dict[str, str], cwd: Path, log: Path, timeout_s: float = 1800) -> Measured:
    """Run ``argv`` to the end (its stderr to ``log``) and return what its process tree used."""
    become_subreaper()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(log, "ab") as err:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        wall = time.perf_counter() - started
    seen = sampler.stop()
    _reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Measured(
        proc.returncode,
        out.decode(errors="replace"),
        wall,
        max(waited, sum(seen.cpu_s.values())),
        seen.peak_rss_bytes / 2**20,
        seen.peak_processes,
        _by_kind(seen),
    )


def _by_kind(seen: TreeSample) -> dict[str, float]:
    totals: dict[str, float] = {}
    for pid, cpu in seen.cpu_s.items():
        kind = seen.kinds.get(pid, "?")
        totals[kind] = round(totals.get(kind, 0.0) + cpu, 2)
    return dict(sorted(totals.items(), key=lambda item: -item[1]))

"""Whether a family's last worker raised its throughput, measured: its tasks per second before and after one joined.

Memory says how many workers fit (tasks.autoscaler.policy); this says whether another one is worth having. A
family's throughput is the sum of its workers' speeds (tasks ended per busy second), as Cosmos-Xenna sizes a
stage (workers x per-worker speed). When workers join a family of n, its throughput with n is kept (from the
tasks each ended since the last change, else all it ended) and a trial opens; once every worker has ended
``trial_tasks`` tasks since the join (not counting the task it held then, nor a new worker's first, its
warm-up), the throughput with the new count is compared: one that did not rise by ``min_gain`` of what it was
makes n the family's ``ceiling``, which the policy neither passes nor, while another family of the GPU has
work, stays above. A ceiling is forgotten after ``retry_s`` (the GPU's other work may have changed), and so is
a trial that never ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Served = Mapping[int, tuple[float, int]]  # pid -> (busy seconds, tasks ended), as a worker publishes them


@dataclass
class Benefit:
    """One family's throughput trials; ``observe`` each tick, read ``ceiling``, ``trial`` and ``verdict``."""

    min_gain: float = 0.05
    trial_tasks: int = 2
    retry_s: float = 300.0
    pids: set[int] = field(default_factory=set)  # the registered workers at the last change of their count
    mark: dict[int, tuple[float, int]] = field(default_factory=dict)  # pid -> its (busy s, tasks) at the mark
    at_change: dict[int, int] = field(default_factory=dict)  # pid -> tasks it had ended at the last change
    before: tuple[int, float, float] | None = None  # an open trial: (workers, tasks/s with them, opened at)
    ceiling: int | None = None
    ceiling_at: float = 0.0
    verdict: str = ""  # the last trial's figures

    def rate(self, served: Served, pids: set[int], tasks: int, whole: bool = False) -> float | None:
        """The family's tasks per second: each worker's tasks ended since its mark over the busy seconds they
        took, summed; None until every one of ``pids`` has ended ``tasks`` since its mark. ``whole``: a worker with
        too few since its mark counts all it has ended (its warm-up too: a low figure, which errs towards growth)."""
        total = 0.0
        for pid in pids:
            busy, done = served.get(pid, (0.0, 0))
            busy0, done0 = self.mark.get(pid, (0.0, 0))
            if done - done0 < tasks or busy <= busy0:
                if not whole or done < 1 or busy <= 0:
                    return None
                busy0, done0 = 0.0, 0
            total += (done - done0) / (busy - busy0)
        return total if pids else None

    @property
    def trial(self) -> str:
        """The open trial, for a hold's reason; "" when none is open."""
        if self.before is None:
            return ""
        n, per_s, _ = self.before
        return f"{n} -> {len(self.pids)} worker(s): {per_s:.3f} tasks/s with {n}, measuring with {len(self.pids)}"

    def observe(self, served: Served, pids: set[int], now: float) -> str:
        """Take this tick's registered ``pids`` and what they published; return a trial's verdict when one ends
        (its figures, for the log), else ""."""
        if self.ceiling is not None and now - self.ceiling_at >= self.retry_s:
            self.ceiling = None
        if self.before is not None and now - self.before[2] >= self.retry_s:
            self.before = None
        if pids != self.pids:
            if pids > self.pids and self.pids and self.before is None:
                per_s = self.rate(served, self.pids, 1, whole=True)
                if per_s is not None:
                    self.before = (len(self.pids), per_s, now)
            elif not pids >= self.pids:
                self.before = None  # a worker left: the trial no longer measures one change
            # Each worker counts afresh from the end of the task it holds now (which ran partly before the
            # change), a new one from the end of its first (its warm-up).
            self.at_change = {p: served.get(p, (0.0, 0))[1] for p in pids}
            self.mark, self.pids = {}, set(pids)
        for p in pids:
            if p not in self.mark and served.get(p, (0.0, 0))[1] > self.at_change.get(p, 0):
                self.mark[p] = served[p]
        if self.before is None:
            return ""
        after = self.rate(served, pids, self.trial_tasks)
        if after is None:
            return ""
        n, per_s, _ = self.before
        self.before = None
        gain = after / per_s - 1.0 if per_s > 0 else float("inf")
        figures = (
            f"{n} -> {len(pids)} worker(s): {per_s:.3f} -> {after:.3f} tasks/s ({gain:+.0%}; "
            f"{self.min_gain:.0%} needed)"
        )
        if gain < self.min_gain:
            self.ceiling, self.ceiling_at = n, now
            self.verdict = f"no gain from {figures}"
        else:
            self.ceiling = None
            self.verdict = f"gain from {figures}"
        return self.verdict

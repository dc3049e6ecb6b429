"""The routing policy: which live GPU queue gets a stage's task, as a pure function."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueLoad:
    """What routing knows of one GPU queue at send time."""

    queue: str
    gpu: int
    workers: int
    waiting: int
    busy: int = 0

    @property
    def load(self) -> float:
        return (self.waiting + self.busy) / self.workers if self.workers else float("inf")


def choose_gpu_queue(
    loads: Iterable[QueueLoad], allowed: Iterable[int] | None = None, previous: int | None = None,
    avoid: int | None = None,
) -> QueueLoad | None:
    """Return the live queue with the least work per worker; ties go to ``previous``, then lowest GPU.

    ``avoid`` (a GPU that just ran out of memory on this task) is taken only if nothing else is live.
    Returns None when no allowed queue has a live worker.
    """
    allowed_set = None if allowed is None else set(allowed)
    live = [q for q in loads if q.workers > 0 and (allowed_set is None or q.gpu in allowed_set)]
    if not live:
        return None
    return min(live, key=lambda q: (q.gpu == avoid, q.load, q.gpu != previous, q.gpu))

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


# A video's next GPU stage stays on the GPU that ran its previous one unless that GPU has more
# than this much more work per worker than the least loaded: its intermediates are in that
# host's page cache, the sender's own worker still counts as busy while it sends, and the
# autoscaler packs each GPU for the stages it runs.
STICKY_TASKS_PER_WORKER = 1.0


def choose_gpu_queue(
    loads: Iterable[QueueLoad],
    allowed: Iterable[int] | None = None,
    previous: int | None = None,
    avoid: int | None = None,
) -> QueueLoad | None:
    """Return the live queue with the least work per worker, or ``previous``'s when it is within
    STICKY_TASKS_PER_WORKER of that; ties go to ``previous``, then the lowest GPU.

    ``avoid`` (a GPU that just ran out of memory on this task) is taken only if nothing else is live.
    Returns None when no allowed queue has a live worker.
    """
    allowed_set = None if allowed is None else set(allowed)
    live = [q for q in loads if q.workers > 0 and (allowed_set is None or q.gpu in allowed_set)]
    if not live:
        return None
    best = min(live, key=lambda q: (q.gpu == avoid, q.load, q.gpu != previous, q.gpu))
    stay = [q for q in live if q.gpu == previous and q.gpu != avoid]
    if stay and stay[0].load <= best.load + STICKY_TASKS_PER_WORKER:
        return stay[0]
    return best

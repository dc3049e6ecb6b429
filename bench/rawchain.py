"""The floor for dispatch: a raw Celery chain of no-op tasks routed like framefleet's (cpu → gpu0 ×3 → cpu).

The app is configured as framefleet's is where it matters for a transition: Redis broker and
results, JSON, late acks, prefetch 1, solo workers (started by bench/transitions.py as
``celery -A bench.rawchain worker -Q raw.cpu -P solo`` and ``-Q raw.gpu0``). Each task appends
its start and end (epoch s) to the list it is given and returns it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, chain

QUEUES = ("raw.cpu", "raw.gpu0", "raw.gpu0", "raw.gpu0", "raw.cpu")
app = Celery("rawchain", broker=os.environ.get("REDIS_URL"), backend=os.environ.get("REDIS_URL"))
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_track_started=True,
    task_send_sent_event=True,
    worker_send_task_events=True,
    result_extended=True,
    task_routes={f"raw.step{i}": {"queue": q} for i, q in enumerate(QUEUES)},
    broker_transport_options={"visibility_timeout": 12 * 3600},
)


def _step(index: int) -> Any:
    @app.task(name=f"raw.step{index}")
    def step(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        start = time.time()
        return [*spans, {"stage": f"step{index}", "start": start, "end": time.time()}]

    return step


STEPS = [_step(i) for i in range(len(QUEUES))]


def chain_of() -> Any:
    """One video's chain of no-op steps."""
    first, *rest = STEPS
    return chain(first.s([]), *(s.s() for s in rest))

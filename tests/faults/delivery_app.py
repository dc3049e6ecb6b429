"""A worker app on the project's Celery configuration (its transport, acks_late, prefetch 1) with one task
that prints its start and end and sleeps: what the delivery fault tests watch for."""

from __future__ import annotations

import time

from tasks import app  # the project's app, with everything it registers (its worker's signals)


@app.task(name="faults.work", acks_late=True)
def work(tag: str, seconds: float) -> str:
    print(f"RUN {tag} start", flush=True)
    time.sleep(seconds)
    print(f"RUN {tag} end", flush=True)
    return tag

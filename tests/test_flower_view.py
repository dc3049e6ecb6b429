"""What Flower is told of a task: its args text, and the task ends an outage swallowed, sent again on real Redis."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from celery import Celery

from tasks.observe.flower_view import RecentEnds, describe, progress_text
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_stage_task_and_the_callback_read_as_their_video_and_run():
    job = {"run_id": "20261126-110102-c8400d", "video_id": "clip_00-23068ef4cb", "video": "kitchen/clip 00.mp4"}
    assert describe((job,)) == "clip 00.mp4 · run 20261126-110102-c8400d"
    assert describe(([job, job], {"run_id": "r1", "output_root": "/out"})) == "run r1 · statistics over 2 videos"
    assert describe(({"run_id": "r1", "output_root": "/out", "videos": 3},)) == "run r1 · statistics over 3 videos"
    assert describe(("something else",)) is None and describe(()) is None
    assert progress_text({**job, "stage": "depth", "done": 8, "total": 40}) == "8/40 frames of kitchen/clip 00.mp4"


def test_the_ends_an_outage_swallowed_are_sent_again_and_only_those(redis_url):
    app = Celery("flower-view-test", broker=redis_url, set_as_current=False)
    app.conf.update(event_serializer="json", accept_content=["json"])
    ends = RecentEnds()
    ends.note("before-outage", "SUCCESS", {"video": "a.mp4", "run_id": "r1"})
    since = time.time()
    ends.note("finished-1", "SUCCESS", {"video": "b.mp4", "run_id": "r1"})
    ends.note("failed-1", "FAILURE", "WorkerLost('gone')")
    ends.note("retried-1", "RETRY", None)
    seen: list[dict] = []
    stop = threading.Event()

    def listen() -> None:
        with app.connection_for_read() as conn:
            receiver = app.events.Receiver(conn, handlers={"*": seen.append})
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):  # a second without events: look at stop again
                    receiver.capture(limit=None, timeout=1, wakeup=False)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        with app.connection_for_write() as conn:
            dispatcher = app.events.Dispatcher(conn, hostname="gpu0@test", enabled=True)

            def both_arrived() -> bool:
                assert ends.resend(dispatcher, since) == 2
                return {e.get("uuid") for e in seen} >= {"finished-1", "failed-1"}

            wait_until(both_arrived, 30, "the resent events", poll_s=0.5)
            dispatcher.close()
    finally:
        stop.set()
        listener.join(timeout=10)
        app.close()
    by_id = {e["uuid"]: e for e in seen}
    assert by_id["finished-1"]["type"] == "task-succeeded" and by_id["finished-1"]["result"] == "b.mp4 · run r1"
    assert by_id["failed-1"]["type"] == "task-failed" and "WorkerLost" in by_id["failed-1"]["exception"]
    assert "before-outage" not in by_id and "retried-1" not in by_id

"""Not a test of the suite (its name is not test_*): what tests/test_session_guard.py runs under the guard.
It starts a cluster as the suite's tests do (the session's redis-server, a real worker in a session of its
own), writes the worker's pid and the guard's tag to $NESTED_READY, and waits to be stopped."""

from __future__ import annotations

import json
import os
import threading

from tests.session_guard import TAG


def test_a_cluster_that_waits_to_be_stopped(workers):
    worker = workers.start("cpu")
    ready = os.environ["NESTED_READY"]
    with open(ready + ".tmp", "w") as f:
        json.dump({"worker": worker.pid, "tag": os.environ[TAG]}, f)
    os.replace(ready + ".tmp", ready)
    threading.Event().wait(300)  # until a signal ends this run: what the outer test sends

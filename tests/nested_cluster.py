"""Not a test of the suite (its name is not test_*): what tests/test_session_guard.py runs under the guard.
It starts a cluster as the suite's tests do (the session's redis-server, a real worker in a session of its
own) and a stray process that no fixture stops (as a test that failed before its cleanup leaves one), writes
their pids and the guard's tag to $NESTED_READY, and waits to be stopped. The teardown a Ctrl-C still runs stops
the worker and Redis; the stray one only the guard ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from tests.session_guard import TAG


def test_a_cluster_that_waits_to_be_stopped(workers):
    worker = workers.start("cpu")
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    ready = os.environ["NESTED_READY"]
    with open(ready + ".tmp", "w") as f:
        json.dump({"worker": worker.pid, "stray": stray.pid, "tag": os.environ[TAG]}, f)
    os.replace(ready + ".tmp", ready)
    threading.Event().wait(300)  # until a signal ends this run: what the outer test sends

"""A task sent while Redis is away reaches its queue once Redis is back, exactly once."""

from __future__ import annotations

import json
import subprocess
import sys

from tasks.delivery import queues
from tests.conftest import ROOT
from tests.faults.conftest import env_for

# Sends framefleet.h5 to gpu0 (the producer's connection is then up and has declared gpu0), waits for
# a line on stdin, then sends it to cpu, a queue that connection has not declared yet, with the app's
# retry policy; each refused connection of that send prints "refused".
SENDER = """
import sys
from tasks import app

job = {"video": "a.mp4", "run_id": "r1", "video_id": "a"}
app.tasks["framefleet.h5"].apply_async(args=(job,), queue="gpu0")
print("ready", flush=True)
sys.stdin.readline()
policy = {**app.conf.task_publish_retry_policy, "errback": lambda exc, s: print("refused", flush=True)}
app.tasks["framefleet.h5"].apply_async(args=(job,), queue="cpu", retry_policy=policy)
print("sent", flush=True)
"""


def test_a_send_to_a_new_queue_while_redis_is_away_arrives_once_redis_is_back(redis_server):
    # kombu's declaration of cpu reconnects on its own and closes the channel the send holds; without
    # the second send the publish failed with AttributeError (a stage's retry was then lost).
    sender = subprocess.Popen(
        [sys.executable, "-c", SENDER],
        cwd=ROOT,
        env=env_for(redis_server.url),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert sender.stdout is not None and sender.stdin is not None
        assert sender.stdout.readline().strip() == "ready"
        redis_server.stop()
        sender.stdin.write("go\n")
        sender.stdin.flush()
        assert sender.stdout.readline().strip() == "refused"  # the send has met the outage
        redis_server.start()
        output = sender.communicate(timeout=120)[0]
    finally:
        sender.kill()
    assert sender.returncode == 0, output[-3000:]
    r = redis_server.client()
    sent = [json.loads(m)["headers"]["task"] for _, m in queues.waiting(r, "cpu")]
    assert sent == ["framefleet.h5"], output[-3000:]

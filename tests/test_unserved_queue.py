"""No run waits on a queue nobody serves: the tasks of a GPU queue whose only worker died before it was ready
are finished by another GPU's worker."""

from __future__ import annotations

import signal

import redis

from tasks.delivery import queues
from tasks.workers import registry
from tests.conftest import enqueue_and_watch, wait_until


def test_tasks_of_a_gpu_queue_whose_worker_died_before_it_was_ready_are_finished_on_another_gpu(
    video_factory, workers, pipeline_env, tmp_path
):
    raw = video_factory(2)
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"], decode_responses=True)
    workers.start("cpu")
    dead = workers.start("gpu0", wait=False)
    dead.send_signal(signal.SIGKILL)  # before it could register: no worker ever consumed gpu0
    dead.wait(timeout=30)
    out = tmp_path / "out"
    run = enqueue_and_watch(raw, out, pipeline_env)
    try:
        # With no live GPU worker, routing sends the GPU stages to gpu0, the first GPU's queue.
        wait_until(lambda: queues.length(r, "gpu0") == 2 or run.poll() is not None, 120, "2 tasks waiting on gpu0")
        assert run.poll() is None, run.communicate()[0]
        assert "gpu0" not in registry.known_gpu_queues(r)
        workers.start("gpu1")  # returns once gpu1 is live; its heartbeat (0.5 s here) rebalances every tick
        wait_until(
            lambda: queues.length(r, "gpu0") == 0 or run.poll() is not None, 60, "gpu1's worker to take gpu0's tasks"
        )
        assert queues.length(r, "gpu0") == 0, "gpu0's tasks still wait with gpu1 live: nothing moved them"
        text, _ = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, text
    assert queues.length(r, "gpu0") == 0
    assert workers.log("gpu1").count("ran depth of") == 2, workers.log("gpu1")

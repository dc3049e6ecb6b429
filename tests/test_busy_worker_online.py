"""A busy solo worker stays online in Celery's event state (and so in Flower) during a long task."""

from __future__ import annotations

import threading
import time

from tests.conftest import run_script, settings_env, wait_until

# 32 s of depth (16 frames), waited rather than computed: it outlasts the 11 s observation on any machine.
LONG_DEPTH = "stages:\n  depth:\n    params: {seconds_per_frame: 2.0}\n"


def test_busy_worker_stays_online_through_a_long_task(video_factory, workers, pipeline_env, tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", pipeline_env["REDIS_URL"])
    from tasks import app, configure
    from worker_config.settings import load_settings

    configure(load_settings())
    state = app.events.State()
    receivers = []

    def listen() -> None:
        with app.connection_for_read() as conn:
            receiver = app.events.Receiver(conn, handlers={"*": state.event})
            receivers.append(receiver)
            receiver.capture(limit=None, timeout=None, wakeup=False)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    env = settings_env(tmp_path, LONG_DEPTH, FRAMEFLEET_HEARTBEAT_INTERVAL_S="2", FRAMEFLEET_REGISTRY_TTL_S="10")
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env)
    out = tmp_path / "out"
    assert (
        run_script(
            "enqueue_dataset.py", str(video_factory(1)), "--out", str(out), "--no-wait", env=pipeline_env
        ).returncode
        == 0
    )
    wait_until(
        lambda: (s := workers.state("gpu0")) and (s["current"] or {}).get("task") == "framefleet.depth",
        120,
        "gpu0 busy on depth",
    )
    started = time.monotonic()
    samples = []
    while time.monotonic() - started < 11:
        worker = state.workers.get("gpu0@test")
        samples.append(bool(worker and worker.alive))
        time.sleep(1)
    still_busy = (workers.state("gpu0")["current"] or {}).get("task") == "framefleet.depth"
    receivers[0].should_stop = True
    assert still_busy, "the depth task should outlast the observation (make it longer)"
    assert samples and all(samples), (samples, list(state.workers))

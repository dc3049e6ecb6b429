"""Flower, as run_local and compose start it: auth, the guard, a busy GPU worker online with its task, live progress."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, free_port, run_script, settings_env, wait_until

# A safety net, not a speed check: real workers start and run here, slowly on a loaded machine.
pytestmark = pytest.mark.timeout(240)

# 80 s of depth for a 4 s clip (40 frames, progress every 8), waited rather than computed so that a loaded
# machine neither stretches it nor is loaded further: the test watches its middle.
LONG_DEPTH = "stages:\n  depth:\n    params: {seconds_per_frame: 2.0}\n"


class Flower:
    """A real ``celery -A tasks flower`` process (``program``: another start than ``python -m celery``) and an
    HTTP client for it."""

    def __init__(
        self, env: dict[str, str], log: Path, auth: str, *args: str, program: tuple[str, ...] = ("-m", "celery")
    ) -> None:
        self.port = free_port()
        self.auth = auth
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, *program, "-A", "tasks", "flower", f"--port={self.port}", *args],
            cwd=ROOT,
            env={**env, "FLOWER_BASIC_AUTH": auth},
            stdout=open(log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def get(self, path: str, auth: str | None = "default") -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        credentials = self.auth if auth == "default" else auth
        if credentials:
            request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def wait_ready(self) -> None:
        wait_until(lambda: self.get("/healthcheck")[0] == 200 or self.proc.poll() is not None, 30, "Flower to listen")
        assert self.proc.poll() is None, self.log.read_text()

    def json(self, path: str) -> dict:
        status, body = self.get(path)
        assert status == 200, (status, body)
        return json.loads(body)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def flower(pipeline_env: dict[str, str], tmp_path: Path) -> Iterator[Flower]:
    env = {k: v for k, v in pipeline_env.items() if not k.startswith("FLOWER_")}
    app = Flower(
        env, tmp_path / "flower.log", f"watcher:{secrets.token_urlsafe(12)}", "--address=127.0.0.1", "--max_tasks=1000"
    )
    app.wait_ready()
    yield app
    app.stop()


@pytest.mark.parametrize("address", [["--address=0.0.0.0"], []], ids=["0.0.0.0", "default-address"])
def test_flower_refuses_to_listen_beyond_loopback_without_auth(pipeline_env, address):
    env = {k: v for k, v in pipeline_env.items() if not k.startswith("FLOWER_")}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "flower", *address, f"--port={free_port()}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "without authentication" in done.stderr and "FLOWER_BASIC_AUTH=user:password" in done.stderr
    assert "--address=127.0.0.1" in done.stderr


def test_flower_beyond_loopback_starts_with_auth_from_the_environment(pipeline_env, tmp_path):
    env = {k: v for k, v in pipeline_env.items() if not k.startswith("FLOWER_")}
    app = Flower(env, tmp_path / "flower.log", "ops:s3cret", "--address=0.0.0.0", "--max_tasks=100")
    try:
        app.wait_ready()
        assert app.get("/api/workers", auth=None)[0] == 401
        assert app.get("/api/workers")[0] == 200
    finally:
        app.stop()
    assert "s3cret" not in (tmp_path / "flower.log").read_text()


def test_flower_shows_a_busy_gpu_worker_online_with_its_task_and_live_progress(
    flower, video_factory, workers, pipeline_env, tmp_path
):
    env = settings_env(tmp_path, LONG_DEPTH)
    workers.start("cpu", env=env, wait=False)
    workers.start("gpu0", env=env, wait=False)
    wait_until(lambda: workers.state("cpu") and workers.state("gpu0"), 60, "both workers to register")
    assert (
        run_script(
            "enqueue_dataset.py",
            str(video_factory(1, seconds=4.0)),
            "--out",
            str(tmp_path / "out"),
            "--no-wait",
            env=pipeline_env,
        ).returncode
        == 0
    )

    def depth_midway() -> bool:
        state = workers.state("gpu0") or {}
        frames = state.get("frames") or [0, 0]
        return (state.get("current") or {}).get("task") == "framefleet.depth" and 0 < frames[0] < frames[1]

    wait_until(depth_midway, 60, "gpu0 midway through depth")

    assert flower.get("/api/workers", auth=None)[0] == 401
    assert flower.get("/api/workers", auth="watcher:wrong")[0] == 401
    assert flower.get("/api/workers")[0] == 200

    def depth_task() -> dict | None:
        tasks = flower.json("/api/tasks")
        return next((t for t in tasks.values() if t["name"] == "framefleet.depth" and t["state"] == "PROGRESS"), None)

    task = wait_until(depth_task, 10, "Flower to show depth in PROGRESS (task-progress events)")
    assert task["worker"] == "gpu0@test"
    # The list names the video and run (args) and the frames done so far (result), not the job dict.
    run_id = json.loads(next((tmp_path / "out" / "runs").glob("*.json")).read_text())["run_id"]
    assert task["args"] == f"clip 00.mp4 · run {run_id}", task["args"]
    done, total = task["result"].split(" frames of ")[0].split("/")
    assert 0 < int(done) < int(total) and task["result"].endswith("clip 00.mp4"), task["result"]
    online = []
    for _ in range(6):  # a busy solo worker sends no heartbeat of its own: ours keeps it online
        online.append(flower.json("/api/workers?status=true").get("gpu0@test"))
        time.sleep(1)
    assert online == [True] * 6, online
    assert depth_midway(), "depth ended during the observation: make LONG_DEPTH longer"

    stored = redis.Redis.from_url(pipeline_env["REDIS_URL"]).get(f"celery-task-meta-{task['uuid']}")
    assert json.loads(stored)["status"] == "PROGRESS"  # update_state, for result readers
    meta = json.loads(stored)["result"]
    assert meta["stage"] == "depth" and meta["video_id"] and 0 < meta["done"] < meta["total"], meta

    preprocess = next(t for t in flower.json("/api/tasks").values() if t["name"] == "framefleet.preprocess")
    assert preprocess["state"] == "SUCCESS" and preprocess["worker"] == "cpu@test"
    sent = {
        (s.labels["worker"], s.labels["task"]): s.value
        for f in text_string_to_metric_families(flower.get("/metrics")[1])
        if f.name == "flower_events"
        for s in f.samples
        if s.name == "flower_events_total" and s.labels["type"] == "task-progress"
    }
    assert sent[("gpu0@test", "framefleet.depth")] >= 1
    # preprocess reports every frame; the events are limited to 2 a second, the first after 0.5 s (a
    # shorter task sends none)
    assert sent.get(("cpu@test", "framefleet.preprocess"), 0) <= 2 * preprocess["runtime"], sent

    status, page = flower.get("/workers")
    assert status == 200 and "gpu0@test" in page
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "install chromium (apt-get install -y chromium); .ci/run does"
    user, password = flower.auth.split(":")
    url = f"http://{user}:{password}@127.0.0.1:{flower.port}/workers"
    common = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--window-size=1280,900",
        "--virtual-time-budget=3000",
    ]
    screenshot = tmp_path / "workers.png"
    shot = subprocess.run([*common, f"--screenshot={screenshot}", url], capture_output=True, text=True, timeout=60)
    assert screenshot.exists() and screenshot.stat().st_size > 20_000, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=60)
    assert "gpu0@test" in dom.stdout, "the browser (basic auth in the URL) should see the worker"
    tasks_page = subprocess.run(
        [*common, "--dump-dom", url.replace("/workers", "/tasks")], capture_output=True, text=True, timeout=60
    )
    rows = [row for row in tasks_page.stdout.split("<tr") if "framefleet.depth" in row]
    assert rows and f"clip 00.mp4 · run {run_id}" in rows[0], tasks_page.stdout[-3000:]
    assert " frames of clip 00.mp4" in rows[0], rows[0]
    workers.stop("gpu0", signal.SIGKILL)  # no need to wait out the long depth task

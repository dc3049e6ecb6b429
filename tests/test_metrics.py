"""The Prometheus exporter against real workers on a fake GPU and a finished run; the Grafana dashboard's names."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tasks.gpu import FakeProbe
from tasks.gpu.fake import FakeGpuLedger
from tests.conftest import ROOT, run_script, settings_env, wait_until

# A safety net, not a speed check: real workers start and run here, slowly on a loaded machine.
pytestmark = pytest.mark.timeout(240)

MIB = 1 << 20
DASHBOARD = ROOT / "deploy" / "grafana" / "framefleet.json"


@pytest.fixture
def exporter(pipeline_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple]:
    """An exporter in this process on the test's Redis, reading a fake GPU ledger of one 24 GiB GPU."""
    from tasks import configure
    from tasks.observe.metrics import start_exporter
    from worker_config.settings import load_settings

    ledger = FakeGpuLedger.create(
        tmp_path / "gpu.json", [{"total_mib": 24576, "name": "Fake GPU 24GB", "utilization_pct": 35}]
    )
    monkeypatch.setenv("REDIS_URL", pipeline_env["REDIS_URL"])
    conf = load_settings()
    configure(conf)
    running = start_exporter(0, conf, probe=FakeProbe(ledger.path))
    yield running, ledger
    running.stop()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def exported_names(text: str) -> set[str]:
    """Every series name a PromQL query may use: samples seen, and those a declared family implies."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in suffixes.get(family.type, [""])}
    return names


def test_exporter_reads_gpus_workers_queues_stages_and_decisions(
    exporter, video_factory, workers, pipeline_env, tmp_path
):
    running, ledger = exporter
    env = settings_env(tmp_path, "stages:\n  depth: {params: {hold_mib: 3000}}\n", FRAMEFLEET_FAKE_GPU=str(ledger.path))
    workers.start("cpu", env=env, wait=False)
    workers.start("gpu0", env=env, wait=False)
    wait_until(lambda: workers.state("cpu") and workers.state("gpu0"), 60, "both workers to register")
    done = run_script(
        "enqueue_dataset.py",
        str(video_factory(1)),
        "--out",
        str(tmp_path / "out"),
        env={**pipeline_env, **env},
        timeout_s=80,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The workers publish their state on their next heartbeat after the last task.
    wait_until(lambda: not workers.state("cpu")["busy"] and not workers.state("gpu0")["busy"], 10, "idle workers")
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    r.sadd("ff:gpu-queues", "gpu7")  # a GPU queue with waiting messages and no worker
    r.rpush("gpu7", "a", "b", "c")
    decision = {
        "gpu": 0,
        "action": "up",
        "reason": "backlog",
        "time": time.time(),
        "used_mib": 3000.0,
        "total_mib": 24576.0,
        "host": "test",
        "worker": "gpu0-1",
        "worker_pid": 1,
    }
    r.rpush("ff:autoscale", json.dumps(decision))

    got = scrape(running.url)
    gpu = (("gpu", "0"), ("name", "Fake GPU 24GB"), ("uuid", "GPU-fake-0"))
    assert got[("framefleet_gpu_memory_used_bytes", gpu)] == 3000 * MIB  # the depth model held on the fake GPU
    assert got[("framefleet_gpu_memory_total_bytes", gpu)] == 24576 * MIB
    assert got[("framefleet_gpu_utilization_ratio", gpu)] == pytest.approx(0.35)
    assert got[("framefleet_gpus", (("probe", "fake"),))] == 1
    assert got[("framefleet_worker_gpu_memory_bytes", (("gpu", "0"), ("worker", "gpu0@test")))] == 3000 * MIB
    assert got[("framefleet_worker_rss_bytes", (("worker", "cpu@test"),))] > 10 * MIB
    assert got[("framefleet_workers", (("gpu", "0"), ("stage", "idle")))] == 1
    assert got[("framefleet_workers", (("gpu", "cpu"), ("stage", "idle")))] == 1
    assert got[("framefleet_queue_depth", (("queue", "gpu7"),))] == 3
    assert got[("framefleet_queue_depth", (("queue", "gpu0"),))] == 0
    assert got[("framefleet_videos_done_total", ())] == 1
    assert got[("framefleet_videos_quarantined", ())] == 0
    for stage in ("preprocess", "depth", "tracks", "hands", "h5"):
        assert got[("framefleet_stage_tasks_total", (("outcome", "done"), ("stage", stage)))] == 1
        assert got[("framefleet_stage_duration_seconds_count", (("stage", stage),))] == 1
        assert got[("framefleet_stage_duration_seconds_bucket", (("le", "+Inf"), ("stage", stage)))] == 1
        assert got[("framefleet_stage_duration_seconds_sum", (("stage", stage),))] > 0
    assert got[("framefleet_autoscale_decisions_total", (("action", "up"), ("gpu", "0")))] == 1
    assert got[("framefleet_up", (("source", "gpu"),))] == 1 and got[("framefleet_up", (("source", "redis"),))] == 1

    # the decision list is trimmed by the autoscaler; the counter still only grows
    r.rpush("ff:autoscale", json.dumps({**decision, "action": "down", "time": time.time() + 1}))
    r.ltrim("ff:autoscale", -1, -1)
    got = scrape(running.url)
    assert got[("framefleet_autoscale_decisions_total", (("action", "up"), ("gpu", "0")))] == 1
    assert got[("framefleet_autoscale_decisions_total", (("action", "down"), ("gpu", "0")))] == 1


def test_the_autoscaler_serves_metrics_with_its_own_decisions_and_workers(pipeline_env, tmp_path):
    ledger = FakeGpuLedger.create(tmp_path / "gpu.json", [{"total_mib": 24576, "name": "Fake GPU 24GB"}])
    config = tmp_path / "gpu.yaml"
    config.write_text("stages:\n  depth: {params: {hold_mib: 2048}}\n")
    argv = [
        sys.executable,
        str(ROOT / "scripts" / "autoscaler.py"),
        "--fake-gpu",
        str(ledger.path),
        "--config",
        str(config),
        "--tick-s",
        "0.5",
        "--max-workers-per-gpu",
        "1",
        "--stop-grace-s",
        "20",
        "--log-dir",
        str(tmp_path / "logs"),
        "--metrics-port",
        "0",
    ]
    log = tmp_path / "autoscaler.log"
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=pipeline_env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        url = wait_until(
            lambda: re.search(r"metrics at (http://\S+)", log.read_text()) or proc.poll() is not None,
            30,
            "the autoscaler's metrics address",
        )
        assert proc.poll() is None, log.read_text()
        url = url.group(1)

        held = ("framefleet_worker_gpu_memory_bytes", (("gpu", "0"), ("worker", f"gpu0-1@{socket.gethostname()}")))

        def worker_on_gpu() -> dict | None:
            got = scrape(url)
            return got if got.get(held) == 2048 * MIB else None

        got = wait_until(worker_on_gpu, 60, "the autoscaler's worker on GPU 0, as its metrics show it")
        assert got[("framefleet_autoscale_decisions_total", (("action", "up"), ("gpu", "0")))] == 1
        assert got[("framefleet_workers", (("gpu", "0"), ("stage", "idle")))] == 1
        assert (
            got[("framefleet_gpu_memory_used_bytes", (("gpu", "0"), ("name", "Fake GPU 24GB"), ("uuid", "GPU-fake-0")))]
            == 2048 * MIB
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=40) == 0, log.read_text()


def test_grafana_dashboard_uses_only_metrics_that_exist(exporter):
    from flower.events import get_prometheus_metrics
    from prometheus_client import REGISTRY, generate_latest

    running, _ = exporter
    get_prometheus_metrics()  # Flower's own metrics, as its /metrics serves them
    known = exported_names(urllib.request.urlopen(running.url, timeout=10).read().decode())
    known |= {n for n in exported_names(generate_latest(REGISTRY).decode()) if n.startswith("flower_")}
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert exprs and all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in panels for t in p["targets"])
    used = {name for e in exprs for name in re.findall(r"\b(?:framefleet|flower)_[a-zA-Z0-9_]+", e)}
    assert used - known == set(), f"the dashboard uses metrics nothing exports: {sorted(used - known)}"
    assert {
        "framefleet_gpu_memory_used_bytes",
        "framefleet_stage_duration_seconds_bucket",
        "framefleet_autoscale_decisions_total",
        "flower_worker_online",
    } <= used

"""run_local end to end on a fake GPU: Flower's login, the metrics line, and the run report with real plots."""

from __future__ import annotations

import json
import stat
import time

import numpy as np
import pytest
import redis
from matplotlib.image import imread

from tasks.gpu.fake import FakeGpuLedger
from tests.conftest import ONE_WORKER_EACH, run_script

# Generous: a whole local cluster starts and runs; on a loaded machine its start alone can take a minute.
pytestmark = pytest.mark.timeout(300)

PLOTS = ("throughput", "gpu_memory", "stage_durations")


def assert_real_plot(path) -> None:
    assert path.exists() and path.stat().st_size > 5_000, path
    pixels = imread(path)
    assert pixels.ndim == 3 and np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0).shape[0] > 10, path


def test_run_local_writes_a_report_with_plots_and_keeps_flower_password_out_of_sight(
    video_factory, pipeline_env, tmp_path
):
    ledger = FakeGpuLedger.create(tmp_path / "gpu.json", [{"total_mib": 24576, "name": "Fake GPU 24GB"}])
    config = tmp_path / "gpu.yaml"
    config.write_text("stages:\n  depth: {params: {hold_mib: 4096, activation_mib: 1024}}\n")
    env = {k: v for k, v in pipeline_env.items() if not k.startswith("FLOWER_")}
    env.update(FRAMEFLEET_FAKE_GPU=str(ledger.path), FRAMEFLEET_CONFIG=str(config))
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    decision = {
        "gpu": 0,
        "action": "up",
        "reason": "backlog 1, room for 5",
        "time": time.time(),
        "used_mib": 0.0,
        "total_mib": 24576.0,
        "host": "test",
        "worker": "gpu0-1",
    }  # as scripts/autoscaler.py records it
    r.rpush("ff:autoscale", json.dumps(decision))
    out = tmp_path / "out"
    done = run_script(
        "run_local.py", str(video_factory(1)), "--out", str(out), *ONE_WORKER_EACH, env=env, timeout_s=240
    )
    assert done.returncode == 0, done.stdout + done.stderr

    auth = out / "logs" / "flower-auth.txt"
    user, password = auth.read_text().strip().split(":")
    assert user == "framefleet" and len(password) >= 20 and stat.S_IMODE(auth.stat().st_mode) == 0o600
    assert f"(user framefleet, password in {auth};" in done.stdout
    assert "Metrics: http://127.0.0.1:" in done.stdout and "/metrics" in done.stdout
    for text in [done.stdout, done.stderr, *(p.read_text(errors="replace") for p in (out / "logs").glob("*.log"))]:
        assert password not in text

    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["outputs"]["report"] == "report.html"
    page = (out / "report.html").read_text()
    for name in PLOTS:
        assert f'src="report/{name}.png"' in page
        assert_real_plot(out / "report" / f"{name}.png")
    assert "No video failed in this run." in page and summary["run_id"] in page
    assert f"from {out / 'logs' / 'gpu-samples.jsonl'}" in page and "OUT/" not in page
    record = json.loads((out / "runs" / f"{summary['run_id']}.json").read_text())
    assert record["status"] == "finished" and record["finished"] == summary["finished"] and record["done"] == 1
    assert (out / "logs" / "gpu-samples.jsonl").read_text().count("\n") >= 2

    # Once Redis has forgotten the run, the report is rebuilt from the run's stage log in OUT/runs/,
    # and without that, from its snapshot.
    r.flushdb()
    stage_log = out / "runs" / f"{summary['run_id']}.stages.jsonl"
    assert len(stage_log.read_text().splitlines()) == 5  # one line per stage of the one video
    again = run_script("report.py", str(out), env=env, timeout_s=60)
    assert again.returncode == 0, again.stderr
    rebuilt = (out / "report.html").read_text()
    assert str(stage_log) in rebuilt and "OUT/" not in rebuilt
    for name in PLOTS:
        assert_real_plot(out / "report" / f"{name}.png")
    stage_log.unlink()
    again = run_script("report.py", str(out), env=env, timeout_s=60)
    assert again.returncode == 0, again.stderr
    assert f"a snapshot ({out / 'report' / 'data.json'})" in (out / "report.html").read_text()

    # With no GPU data at all, the report says so instead of drawing an empty plot.
    (out / "logs" / "gpu-samples.jsonl").unlink()
    (out / "report" / "data.json").unlink()
    bare = run_script("report.py", str(out), env=env, timeout_s=60)
    assert bare.returncode == 0, bare.stderr
    page = (out / "report.html").read_text()
    assert "No GPU memory data for this run" in page and not (out / "report" / "gpu_memory.png").exists()
    assert_real_plot(out / "report" / "throughput.png")  # from the HDF5 files' times
    assert_real_plot(out / "report" / "stage_durations.png")  # from the summary's means


@pytest.mark.parametrize(
    ("wall_s", "unit", "word"), [(16.0, 1.0, "seconds"), (600.0, 60.0, "minutes"), (5 * 3600.0, 3600.0, "hours")]
)
def test_the_time_axis_unit_follows_the_run_length(wall_s, unit, word):
    from tasks.report.report import time_axis

    assert time_axis({"wall_s": wall_s}) == (unit, f"{word} since the run started")


def test_report_refuses_a_folder_without_a_finished_run(pipeline_env, tmp_path):
    done = run_script("report.py", str(tmp_path), env=pipeline_env, timeout_s=60)
    assert done.returncode == 2 and "no run summary" in done.stderr

"""A CUDA out-of-memory error (scripted on the fake GPU) is retried elsewhere with smaller chunks."""

from __future__ import annotations

import json

import redis

from tasks.gpu.fake import FakeGpuLedger
from tests.conftest import run_script, settings_env

BIG_ACTIVATIONS = "stages:\n  depth:\n    params: {hold_mib: 1000, activation_mib: 4000}\n"


def test_oom_is_retried_on_another_gpu_with_smaller_chunks(video_factory, workers, pipeline_env, tmp_path):
    ledger = tmp_path / "gpus.json"
    FakeGpuLedger.create(
        ledger,
        [
            {"index": 0, "total_mib": 24000, "oom_at_mib": 3000},  # holds the model, not the activations
            {"index": 1, "total_mib": 24000, "oom_at_mib": 4500},  # fits them once halved
        ],
    )
    env = settings_env(tmp_path, BIG_ACTIVATIONS, FRAMEFLEET_FAKE_GPU=str(ledger))
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env)
    workers.start("gpu1", env=env)
    out = tmp_path / "out"
    done = run_script("enqueue_dataset.py", str(video_factory(1)), "--out", str(out), env={**pipeline_env, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["done"] == 1
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    records = [json.loads(x) for x in r.lrange("ff:oom", 0, -1)]
    assert records and records[-1]["stage"] == "depth" and records[-1]["gpu"] == 0
    assert summary["stages"]["depth"]["workers"] == {"gpu1@test": 1}
    assert "OutOfMemoryError" in workers.log("gpu0") or "out of memory" in workers.log("gpu0")


def test_a_video_that_never_fits_is_failed_with_its_peak_not_looped(video_factory, workers, pipeline_env, tmp_path):
    ledger = tmp_path / "gpus.json"
    FakeGpuLedger.create(ledger, [{"index": 0, "total_mib": 24000, "oom_at_mib": 1010}])
    env = settings_env(tmp_path, BIG_ACTIVATIONS + "    max_retries: 2\n", FRAMEFLEET_FAKE_GPU=str(ledger))
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env)
    out = tmp_path / "out"
    done = run_script(
        "enqueue_dataset.py", str(video_factory(1)), "--out", str(out), env={**pipeline_env, **env}, timeout_s=200
    )
    assert done.returncode == 1, done.stdout + done.stderr
    failure = json.loads((out / "run_summary.json").read_text())["failed"][0]
    assert failure["stage"] == "depth" and failure["error_class"] == "GpuOutOfMemory"
    assert failure["attempts"] == 3 and "peak" in failure["reason"]

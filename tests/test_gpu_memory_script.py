"""scripts/gpu_memory.py run as a user runs it: on a fake GPU ledger, with and without Redis, and with no GPU."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
import redis

from tasks.gpu import LEDGER_ENV, FakeGpuLedger
from tasks.workers.registry import publish
from tests.conftest import BASE_REDIS, PIPELINE_ENV, run_script

pytestmark = pytest.mark.timeout(60)

# A database of its own, flushed before and after each test; override where 12 is taken.
REDIS_URL = f"{BASE_REDIS}/{int(os.environ.get('FRAMEFLEET_GPU_MEMORY_TEST_DB', '12'))}"


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in PIPELINE_ENV and not k.startswith("FRAMEFLEET_")}
    return {**clean, "REDIS_URL": REDIS_URL}


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not a framefleet worker."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def ledger(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> FakeGpuLedger:
    """Two fake GPUs: this test process holds 14000 MiB of GPU 0 as a worker would, ``sleeper`` 2000 MiB."""
    ledger = FakeGpuLedger.create(
        tmp_path / "gpus.json",
        [
            {"name": "Fake GPU 24GB", "total_mib": 24576, "utilization_pct": 37},
            {"name": "Fake GPU 12GB", "total_mib": 12288},
        ],
    )
    ledger.allocate(0, 14000)
    ledger.allocate(0, 2000, pid=sleeper.pid)
    return ledger


def register_this_process_as_worker(r: redis.Redis) -> str:
    hostname = f"gpu0@{socket.gethostname()}"
    publish(
        r,
        {
            "hostname": hostname,
            "pid": os.getpid(),
            "gpu": 0,
            "queues": ["gpu0"],
            "gpu_queues": ["gpu0"],
            "stages": ["depth", "tracks", "hands"],
            "busy": True,
        },
        ttl_s=60,
    )
    return hostname


def test_info_splits_each_gpu_between_framefleet_workers_and_other_processes(r, env, ledger, sleeper):
    hostname = register_this_process_as_worker(r)
    # A worker of another host with a pid that happens to be the sleeper's is not the sleeper.
    publish(r, {"hostname": "gpu1@elsewhere", "pid": sleeper.pid, "gpu": 1, "queues": ["gpu1"]}, ttl_s=60)
    r.hset("ff:profiles", "Fake GPU 24GB|depth|synthetic|640x480", json.dumps({"peak_mib": 14500.0, "tasks": 3}))

    out = run_script("gpu_memory.py", "info", "--fake", str(ledger.path), env=env, timeout_s=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "GPU 0  Fake GPU 24GB  (GPU-fake-0)" in text
    assert "memory 16000 / 24576 MiB used, 8576 MiB free; utilisation 37%" in text
    assert re.search(
        rf"pid +{os.getpid()} +14000 MiB  framefleet worker {re.escape(hostname)} \(queues gpu0, busy\)", text
    ), text
    assert re.search(rf"pid +{sleeper.pid} +2000 MiB  other process \(sleep\)", text), text
    assert "GPU 1  Fake GPU 12GB  (GPU-fake-1)" in text and "memory 0 / 12288 MiB used" in text
    assert "no compute processes" in text
    assert "(1 framefleet worker(s) registered on other hosts)" in text
    assert "Fake GPU 24GB | depth | synthetic | 640x480: peak 14500 MiB" in text
    assert ledger.readings()[1]  # it only reads: nothing was freed or killed
    assert sleeper.poll() is None


def test_info_without_redis_still_shows_the_gpus(env, ledger, sleeper):
    env = {**env, "REDIS_URL": "redis://127.0.0.1:1/0"}  # nothing listens on port 1
    out = run_script("gpu_memory.py", "info", "--fake", str(ledger.path), env=env, timeout_s=60)
    assert out.returncode == 0, out.stderr
    assert "Redis at redis://127.0.0.1:1/0 is unreachable" in out.stdout
    assert "memory 16000 / 24576 MiB used" in out.stdout
    assert re.search(rf"pid +{os.getpid()} +14000 MiB  other process", out.stdout)


def test_monitor_reprints_until_its_time_is_up(r, env, ledger):
    out = run_script(
        "gpu_memory.py", "monitor", "0.5", "--interval-s", "0.2", "--fake", str(ledger.path), env=env, timeout_s=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("GPU 0  Fake GPU 24GB") == 3  # at 0, 0.2 and 0.4 s


def test_suggest_fits_workers_from_learned_or_given_peaks(r, env, ledger):
    r.hset(
        "ff:profiles",
        mapping={
            "Fake GPU 24GB|depth|synthetic|640x480": json.dumps({"peak_mib": 14500}),
            "Fake GPU 24GB|tracks|synthetic|640x480": json.dumps({"peak_mib": 5000}),
            "Other GPU|hands|synthetic|640x480": json.dumps({"peak_mib": 10}),
            "Fake GPU 12GB|depth+tracks+hands|synthetic|512x384": json.dumps({"peak_mib": 5500, "samples": 2}),
        },
    )
    out = run_script("gpu_memory.py", "suggest", "--fake", str(ledger.path), env=env, timeout_s=60)
    assert out.returncode == 0, out.stderr
    gpu0, gpu1 = out.stdout.split("\nGPU 1  ")
    assert re.search(r"depth +peak +14500 MiB \(learned, synthetic 640x480\): 1 worker\(s\)", gpu0)
    assert re.search(r"tracks +peak +5000 MiB \(learned, synthetic 640x480\): 4 worker\(s\)", gpu0)  # 23552 / 5000
    assert "hands " not in gpu0 and not re.search(r"peak +10 MiB", out.stdout)  # another model's profile
    assert re.search(r"depth\+tracks\+hands +peak +5500 MiB \(learned, synthetic 512x384\): 2 worker\(s\)", gpu1)

    out = run_script(
        "gpu_memory.py",
        "suggest",
        "--fake",
        str(ledger.path),
        "--headroom-mib",
        "4000",
        "--stage-peak-mib",
        "tracks=2000",
        "hands=3000",
        env=env,
        timeout_s=60,
    )
    assert out.returncode == 0, out.stderr
    gpu0, gpu1 = out.stdout.split("\nGPU 1  ")
    assert re.search(r"tracks +peak +2000 MiB \(given\): 10 worker\(s\)", gpu0)  # (24576 - 4000) / 2000
    assert re.search(r"hands +peak +3000 MiB \(given\): 6 worker\(s\)", gpu0)
    assert re.search(r"depth +peak +14500 MiB \(learned", gpu0) and "14500" not in gpu1
    assert re.search(r"tracks +peak +2000 MiB \(given\): 4 worker\(s\)", gpu1)  # (12288 - 4000) / 2000

    out = run_script(
        "gpu_memory.py",
        "suggest",
        "--fake",
        str(ledger.path),
        env={**env, "REDIS_URL": "redis://127.0.0.1:1/0"},
        timeout_s=60,
    )
    assert out.returncode == 0 and "unreachable" in out.stdout
    assert out.stdout.count("no peak known for this GPU model") == 2

    bad = run_script("gpu_memory.py", "suggest", "--stage-peak-mib", "depth=lots", env=env, timeout_s=60)
    assert bad.returncode == 2 and "STAGE=MIB" in bad.stderr


def test_without_a_gpu_it_says_so_and_exits_0(env):
    out = run_script("gpu_memory.py", "info", env=env, timeout_s=60)
    assert out.returncode == 0, out.stderr
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert out.stdout.strip() == "no GPU visible (no NVML or no device); nothing to show"
        return
    pynvml.nvmlShutdown()
    assert "GPU 0" in out.stdout or "no GPU visible" in out.stdout  # a GPU machine shows its GPUs


def test_a_missing_ledger_is_a_clear_error(env, tmp_path):
    out = run_script("gpu_memory.py", "info", "--fake", str(tmp_path / "none.json"), env=env, timeout_s=60)
    assert out.returncode == 2 and "no fake GPU ledger at" in out.stderr
    out = run_script("gpu_memory.py", "info", env={**env, LEDGER_ENV: str(tmp_path / "none.json")}, timeout_s=60)
    assert out.returncode == 2 and "no fake GPU ledger at" in out.stderr

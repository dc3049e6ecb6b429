"""The parts the CPU benchmarks share: a private redis-server, processes stopped at the end, workers awaited.

Not a benchmark of its own: bench/transitions.py, delivery_cost.py and replica_wait_cost.py import it.
(Its former ``ff-1by1``/``raw-chain`` modes are measured today by bench/transitions.py; git keeps them:
``git show 02e2257:bench/modes_queue.py``.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

# The benchmarks measure the orchestration with the synthetic stand-ins, as their recorded results did.
os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server on a free port for the duration of the block; yields its URL."""
    import redis

    from tasks.redis_client import free_port, server_argv

    folder = Path(tempfile.mkdtemp(prefix="ff-bench-redis-"))
    port = free_port()
    proc = subprocess.Popen(server_argv(port, folder), stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        for _ in range(200):
            with suppress(redis.ConnectionError):
                client.ping()
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def processes(logs: Path) -> Iterator[Any]:
    """Start processes with ``start(name, argv, env)``; every one is stopped (warm, then killed) at the end."""
    started: list[subprocess.Popen[bytes]] = []
    logs.mkdir(parents=True, exist_ok=True)

    def start(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(logs / f"{name}.log", "ab")
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_registered(url: str, names: list[str], timeout_s: float = 120) -> None:
    from tasks.redis_client import get_redis
    from tasks.workers import registry

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = {w["hostname"].split("@")[0] for w in registry.live_workers(get_redis(url))}
        if set(names) <= live:
            return
        time.sleep(0.1)
    raise RuntimeError(f"workers {names} did not register in {timeout_s} s")

"""The queued systems: framefleet's local cluster, framefleet one video at a time, and a raw Celery chain.

Each starts its own redis-server (so Redis is inside the measured process tree) and returns
the spans of every (video, stage): start and end (epoch s), seconds in the stage's model, worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server on a free port for the duration of the block; yields its URL."""
    import redis

    folder = Path(tempfile.mkdtemp(prefix="ff-bench-redis-"))
    port = _free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
    )
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


def stage_log(redis_url: str) -> list[dict[str, Any]]:
    """framefleet's stage logs (ff:run:<id>:stages, every run) as spans."""
    import redis

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    entries = [json.loads(raw) for key in r.scan_iter(match="ff:run:*:stages") for raw in r.lrange(key, 0, -1)]
    return [
        {
            "video": e["video"],
            "stage": e["stage"],
            "start": e["start"],
            "end": e["end"],
            "run_s": e.get("run_s", 0.0),
            "worker": e["worker"],
        }
        for e in entries
        if e.get("ok")
    ]


def framefleet(raw_dir: Path, out_dir: Path, limit: int | None, extra: list[str]) -> dict[str, Any]:
    """``scripts/run_local.py`` on the videos, against a private Redis read afterwards."""
    with private_redis() as url:
        env = {**os.environ, "REDIS_URL": url}
        argv = [
            sys.executable,
            str(ROOT / "scripts" / "run_local.py"),
            str(raw_dir),
            "--out",
            str(out_dir),
            *(["--limit", str(limit)] if limit else []),
            *extra,
        ]
        started = time.time()
        done = subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode:
            raise RuntimeError(f"run_local.py failed ({done.returncode}):\n{done.stdout[-3000:]}")
        summary = json.loads((out_dir / "run_summary.json").read_text())
        return {"spans": stage_log(url), "run_wall_s": summary["wall_s"], "launched": started}


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


def framefleet_one_by_one(raw_dir: Path, out_dir: Path, videos: int) -> dict[str, Any]:
    """framefleet's chain, one video at a time on an idle cluster: every gap is dispatch, none is queueing."""
    with private_redis() as url:
        os.environ["REDIS_URL"] = url  # before tasks is imported: the settings read it once
        from celery import chain

        from bench.modes_local import jobs_for
        from tasks.autoscaler.supervisor import worker_argv
        from tasks.pipeline import STAGE_TASKS

        env = {**os.environ, "REDIS_URL": url}
        with processes(out_dir / "logs") as start:
            start("gpu0", worker_argv("gpu0", "gpu0"), env)
            # A solo worker, as run_local.py's CPU workers are (one supervised solo process per core)
            # and as the raw chain's are: a prefork pool adds its parent-to-child hand-off.
            start("cpu", worker_argv("cpu", "cpu"), env)
            _wait_registered(url, ["gpu0", "cpu"])
            spans = []
            jobs = jobs_for(raw_dir, out_dir, videos + 1)
            for i, job in enumerate(jobs):
                result = chain(
                    *(STAGE_TASKS[s].s(job) if not k else STAGE_TASKS[s].s() for k, s in enumerate(job["chain"]))
                ).apply_async()
                final = result.get(timeout=300, propagate=True)
                if i == 0:
                    continue  # the first video warms the workers up
                spans += [
                    {
                        "video": final["video_id"],
                        "stage": s,
                        "start": t["start"],
                        "end": t["end"],
                        "run_s": t.get("run_s", 0.0),
                        "worker": t["worker"],
                    }
                    for s, t in final["timings"].items()
                ]
        return {"spans": spans}


def raw_chain(videos: int, in_flight: int) -> dict[str, Any]:
    """No-op chains: ``videos`` one at a time (transition gaps), then ``in_flight`` at once (wall)."""
    with private_redis() as url:
        os.environ["REDIS_URL"] = url
        from bench import rawchain

        rawchain.app.conf.update(broker_url=url, result_backend=url)
        env = {**os.environ, "REDIS_URL": url}
        logs = Path(tempfile.mkdtemp(prefix="ff-bench-raw-"))
        with processes(logs) as start:
            for queue in ("raw.cpu", "raw.gpu0"):
                start(
                    queue,
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "bench.rawchain",
                        "worker",
                        "-Q",
                        queue,
                        "-P",
                        "solo",
                        "-c",
                        "1",
                        "-n",
                        f"{queue}@%h",
                        "-E",
                        "--without-gossip",
                        "--without-mingle",
                        "--loglevel",
                        "WARNING",
                    ],
                    env,
                )
            deadline = time.monotonic() + 60
            while len(rawchain.app.control.ping(timeout=0.5)) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"raw chain workers did not answer; see {logs}")
            spans = []
            for i in range(videos + 1):
                steps = rawchain.chain_of().apply_async().get(timeout=60)
                if i:
                    spans += [{"video": f"v{i}", "worker": "raw", "run_s": 0.0, **s} for s in steps]
            began = time.perf_counter()
            results = [rawchain.chain_of().apply_async() for _ in range(in_flight)]
            for result in results:
                result.get(timeout=300)
            wall = time.perf_counter() - began
        shutil.rmtree(logs, ignore_errors=True)
        return {"spans": spans, "run_wall_s": wall}

#!/usr/bin/env python3
"""What a stage transition costs: framefleet's chain one video at a time against a raw Celery chain.

    python bench/modes_queue.py RAW_DIR [--videos 20] [--work DIR]

``ff-1by1``: framefleet's chain over RAW_DIR's videos, one at a time on an idle cluster (a solo gpu0 and a
solo cpu worker), so every gap between a stage's end and the next one's start is dispatch, none is queueing.
``raw-chain``: no-op Celery tasks routed cpu -> gpu0 x3 -> cpu (bench/rawchain.py), the floor for dispatch.
Each runs in a child process against its own redis-server; the first video of each warms the workers and
is left out. Prints the median and p90 gap (ms) of each and per transition. The other benchmarks take their
shared parts from here: ``private_redis`` (a redis-server on a free port) and ``processes``.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT))


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

        # The workers take jobs only under the roots they are given (tasks.config's dataset_root, output_root).
        roots = {"FRAMEFLEET_DATASET_ROOT": str(raw_dir.resolve()), "FRAMEFLEET_OUTPUT_ROOT": str(out_dir.resolve())}
        env = {**os.environ, "REDIS_URL": url, **roots}
        with processes(out_dir / "logs") as start:
            start("gpu0", worker_argv("gpu0", "gpu0"), env)
            # A solo worker, as run_local.py's CPU workers are (one supervised solo process per core)
            # and as the raw chain's are: a prefork pool adds its parent-to-child hand-off.
            start("cpu", worker_argv("cpu", "cpu"), env)
            _wait_registered(url, ["gpu0", "cpu"])
            spans = []
            jobs = jobs_for(raw_dir, out_dir, videos + 1)
            for i, job in enumerate(jobs):
                steps = [STAGE_TASKS[s].s(job) if not k else STAGE_TASKS[s].s() for k, s in enumerate(job["chain"])]
                steps[-1] = steps[-1].set(ignore_result=False)  # the stages store no result unless asked
                result = chain(*steps).apply_async()
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


def gaps(spans: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per transition "a->b": each video's seconds from the end of stage a to the start of stage b."""
    by_video: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_video.setdefault(span["video"], []).append(span)
    found: dict[str, list[float]] = {}
    for steps in by_video.values():
        steps.sort(key=lambda s: s["start"])
        for prev, nxt in zip(steps, steps[1:], strict=False):
            found.setdefault(f"{prev['stage']}->{nxt['stage']}", []).append(nxt["start"] - prev["end"])
    return found


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path, help="a folder of videos (framefleet sample makes one)")
    parser.add_argument("--videos", type=int, default=20, help="videos timed, after one that warms up")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-transitions"))
    parser.add_argument("--child", choices=["ff-1by1", "raw-chain"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        out = args.work / args.child
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        found = (
            framefleet_one_by_one(args.raw, out, args.videos) if args.child == "ff-1by1" else raw_chain(args.videos, 1)
        )
        print(json.dumps(found["spans"]))
        return 0
    for mode in ("ff-1by1", "raw-chain"):
        child = [sys.executable, __file__, str(args.raw), "--videos", str(args.videos), "--work", str(args.work)]
        done = subprocess.run([*child, "--child", mode], capture_output=True, text=True)
        if done.returncode:
            print(f"{mode} failed ({done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        found = gaps(json.loads(done.stdout.strip().splitlines()[-1]))
        every = [g for values in found.values() for g in values]
        print(f"{mode}: gap median {ms(every, 0.5):.1f} ms, p90 {ms(every, 0.9):.1f} ms over {len(every)} transitions")
        for name, values in found.items():
            print(f"  {name}: median {ms(values, 0.5):.1f} ms, p90 {ms(values, 0.9):.1f} ms (n={len(values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Restart Redis again and again under one idle solo worker; count the restarts it does not come back from.

One ``cpu`` worker (solo, ``-l DEBUG``, as the fault tests start it) on a private redis-server with
an append-only file. Each round: a probe task (an unregistered name: the worker logs it and acks
it), a random wait of 0 to ``--max-wait-s`` seconds, Redis stopped (SIGTERM) and started again at
once (``--freeze``: with the worker stopped by SIGSTOP meanwhile, as a loaded machine may leave it
unscheduled), then a second probe, which the worker must log within ``--deadline-s``. After a miss
the worker's stacks are logged (Celery's SIGUSR1 handler), MONITOR's capture of the round is kept,
and a new worker takes over. Logs and captures stay in the folder printed.

    .venv/bin/python bench/idle_worker_restart.py --rounds 25
    .venv/bin/python bench/idle_worker_restart.py --rounds 10 --freeze
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks.keys import WORKER_PREFIX  # noqa: E402
from tasks.redis_client import free_port, server_argv  # noqa: E402


class Server:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            server_argv(self.port, self.folder, persistent=True),
            stdout=open(self.folder / "redis.log", "ab"),
            stderr=subprocess.STDOUT,
        )
        client = redis.Redis(port=self.port)
        for _ in range(400):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.005)
        raise RuntimeError("redis-server did not answer")

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=20)


def monitor(port: int, path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["redis-cli", "-p", str(port), "monitor"], stdout=open(path, "ab"), stderr=subprocess.STDOUT
    )


def probe(url: str) -> str:
    """Send a task of a name no worker has to the cpu queue (ringing its doorbell); return its id."""
    from celery import Celery

    import tasks.celery_app  # noqa: F401  (framefleet's transport: the send rings the doorbell)

    sender = Celery("probe", broker=url, set_as_current=False)
    sender.conf.update(task_serializer="json", accept_content=["json"], broker_connection_retry_on_startup=True)
    try:
        return str(sender.send_task("framefleet.probe", args=(), queue="cpu", task_id=str(uuid.uuid4())).id)
    finally:
        sender.close()


def seen(log: Path, task_id: str, deadline_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if task_id in log.read_text(errors="replace"):
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def start_worker(url: str, log: Path, loglevel: str) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "FRAMEFLEET_CONFIG", "FRAMEFLEET_REDIS_URL")},
        "REDIS_URL": url,
        "PYTHONPATH": str(ROOT),
        "FRAMEFLEET_HEARTBEAT_INTERVAL_S": "0.5",
        "FRAMEFLEET_REGISTRY_TTL_S": "3",
        "FRAMEFLEET_LEASE_TTL_S": "6",
        "FRAMEFLEET_DEFAULT_BACKENDS": "synthetic",
        "PYTHONUNBUFFERED": "1",
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "cpu", "-P", "solo", "-c", "1"]
        + ["-n", "cpu@test", "-E", "--without-gossip", "--without-mingle", "--loglevel", loglevel],
        cwd=ROOT,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = redis.Redis.from_url(url)
    client.delete(WORKER_PREFIX + "cpu@test")
    for _ in range(600):
        if client.get(WORKER_PREFIX + "cpu@test"):
            return worker
        time.sleep(0.1)
    raise RuntimeError(f"the worker did not register; see {log}")


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--max-wait-s", type=float, default=5.0, help="longest random wait before a restart")
    parser.add_argument("--down-s", type=float, default=0.0, help="seconds between Redis's exit and its start")
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="stop the worker (SIGSTOP) across the restart: its loop meets the closed sockets with Redis back",
    )
    parser.add_argument("--deadline-s", type=float, default=20.0, help="how long the probe after a restart may wait")
    parser.add_argument("--loglevel", default="DEBUG")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="idle-restart-"))
    server = Server(folder)
    server.start()
    url = f"redis://127.0.0.1:{server.port}/0"
    worker_n = 1
    log = folder / f"cpu-{worker_n}.log"
    worker = start_worker(url, log, args.loglevel)
    print(f"folder {folder}  redis port {server.port}", flush=True)
    missed = 0
    try:
        for n in range(1, args.rounds + 1):
            first = probe(url)
            if seen(log, first, args.deadline_s) is None:
                print(f"round {n}: the worker took no probe before the restart", flush=True)
                return 2
            wait_s = random.uniform(0, args.max_wait_s)
            time.sleep(wait_s)
            mon = folder / f"monitor-{n}.txt"
            if args.freeze:
                os.kill(worker.pid, signal.SIGSTOP)
            stopped = time.time()
            server.stop()
            time.sleep(args.down_s)
            server.start()
            back = time.time()
            if args.freeze:
                os.kill(worker.pid, signal.SIGCONT)
            watcher = monitor(server.port, mon)
            second = probe(url)
            took = seen(log, second, args.deadline_s)
            watcher.terminate()
            watcher.wait()
            print(
                f"round {n}: wait {wait_s:.2f} s, Redis stopped at "
                f"{time.strftime('%H:%M:%S', time.localtime(stopped))}.{int(stopped % 1 * 1000):03d} and back "
                f"{1000 * (back - stopped):.0f} ms later, "
                + (f"probe taken after {took:.2f} s" if took is not None else "PROBE NOT TAKEN"),
                flush=True,
            )
            if took is not None:
                mon.unlink()
                continue
            missed += 1
            os.kill(worker.pid, signal.SIGUSR1)  # Celery logs every thread's stack
            time.sleep(2)
            stop_worker(worker)
            worker_n += 1
            log = folder / f"cpu-{worker_n}.log"
            worker = start_worker(url, log, args.loglevel)
    finally:
        stop_worker(worker)
        server.stop()
    print(f"{missed} of {args.rounds} restarts missed; logs and MONITOR captures of the misses in {folder}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Fault-injection fixtures: a private redis-server with AOF, workers on it, and the checks every scenario makes."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from tasks.redis_client import server_argv
from tests.conftest import (
    CONFINED_ENV,
    PIPELINE_ENV,
    ROOT,
    UNRECORDED_ENV,
    Workers,
    free_port,
    run_script,
    wait_for_run_end,
    wait_until,
)

VIDEOS = 4


class RedisServer:
    """A redis-server of one test, with an append-only file so a restart keeps every key (unless ``persistent``
    is False: then a restart loses everything, as a Redis without persistence does)."""

    def __init__(self, folder: Path, password: str | None = None, persistent: bool = True) -> None:
        self.folder = folder
        self.port = free_port()
        self.password = password
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = server_argv(self.port, self.folder, persistent=self.persistent)
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv, stdout=open(self.folder / "redis.log", "ab"), stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _pings(client), 20, "redis-server to answer")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)


class RedisProxy:
    """A TCP proxy in front of a Redis: ``down()`` drops every connection and refuses new ones until ``up()``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.open = threading.Event()
        self.open.set()
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def down(self) -> None:
        self.open.clear()
        with self.lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self.conns.clear()

    def up(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.down()
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open.is_set():
                client.close()  # the client sees its connection reset: a Redis error
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    yield server
    server.stop()


def env_for(url: str, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in PIPELINE_ENV}
    env.update(
        REDIS_URL=url,
        PYTHONPATH=str(ROOT),
        FRAMEFLEET_HEARTBEAT_INTERVAL_S="0.5",
        FRAMEFLEET_REGISTRY_TTL_S="3",
        FRAMEFLEET_LEASE_TTL_S="6",
        PYTHONUNBUFFERED="1",
        **{**CONFINED_ENV, **UNRECORDED_ENV, **extra},
    )
    return env


@pytest.fixture
def fault_env(redis_server: RedisServer) -> dict[str, str]:
    return env_for(redis_server.url)


@pytest.fixture
def fault_workers(fault_env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(fault_env, tmp_path / "logs")
    yield pool
    pool.stop_all()


@pytest.fixture(scope="session")
def fault_raw(video_factory) -> Path:
    return video_factory(VIDEOS)


@pytest.fixture(scope="session")
def reference_stats(fault_raw: Path, cluster: Workers, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """normalization_stats.yaml of a fault-free run of the same videos (on the session's shared workers)."""
    out = tmp_path_factory.mktemp("reference") / "out"
    done = run_script("enqueue_dataset.py", str(fault_raw), "--out", str(out), env=cluster.env)
    assert done.returncode == 0, done.stdout + done.stderr
    return yaml.safe_load((out / "normalization_stats.yaml").read_text())


def wait_for_summary(out: Path, run_index: int = 1, timeout_s: float = 300) -> dict:
    """Wait until ``run_index`` runs have ended (tasks.run.runs.ended: the end whole); return the newest's summary."""
    from tasks.run import runs

    def written() -> dict | None:
        path = out / "run_summary.json"
        if not path.exists():
            return None
        summary = json.loads(path.read_text())
        if len(list((out / "runs").glob("*.json"))) < run_index or not runs.ended(out, summary["run_id"]):
            return None
        return summary

    return wait_until(written, timeout_s, "the run's end", poll_s=0.5)


def record(
    scenario: str, faults: str, out: Path, reference: dict | None, recovered_s: float | None, logs: Path | None = None
) -> None:
    """Append one row of the fault table to $FRAMEFLEET_FAULT_REPORT (the fault table a CI run leaves).

    With ``logs``, the row also counts the stage runs in the workers' logs and how many ran twice.
    """
    import os

    path = os.environ.get("FRAMEFLEET_FAULT_REPORT")
    if not path:
        return
    manifest = {v["video_id"] for v in json.loads((out / "manifest.json").read_text())["videos"]}
    complete = {p.stem for p in out.glob("*.hdf5")}
    quarantined = set()
    if (out / "quarantine.jsonl").exists():
        quarantined = {json.loads(x)["video_id"] for x in (out / "quarantine.jsonl").read_text().splitlines()}
    expected = {f"{s}{ext}" for s in ("preprocess", "depth", "tracks", "hands") for ext in (".npz", ".done.json")}
    extra = [p for p in out.glob("work/*/*") if p.name not in expected | {"h5.done.json"}]
    diff = None
    if reference is not None and (out / "normalization_stats.yaml").exists():
        stats = yaml.safe_load((out / "normalization_stats.yaml").read_text())
        diff = max(_rel(a, b) for key in reference for a, b in _pairs(stats.get(key), reference[key]))
    row = {
        "scenario": scenario,
        "faults": faults,
        "videos": len(manifest),
        "complete": len(complete),
        "quarantined": len(quarantined),
        "lost": len(manifest - complete - quarantined),
        "duplicated": len(extra),
        "temporary": len(list(out.rglob("*.tmp"))),
        "stats_rel_diff": diff,
        "recovered_s": recovered_s,
    }
    if (out / "run_summary.json").exists():  # videos whose message was gone, sent again by the sweep
        row["resent"] = len(json.loads((out / "run_summary.json").read_text()).get("resent", []))
    if logs is not None:
        runs = stage_runs(logs)
        row.update(stage_runs=sum(runs.values()), double_runs=sum(1 for n in runs.values() if n > 1))
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def _pairs(a, b):
    if isinstance(b, list):
        return list(zip(a, b, strict=True))
    return [(a, b)] if isinstance(b, float) else []


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def assert_nothing_lost(out: Path, reference: dict | None = None) -> dict:
    """Every video complete or quarantined; no temporary or torn file; statistics as fault-free."""
    manifest = {v["video_id"] for v in json.loads((out / "manifest.json").read_text())["videos"]}
    complete = {p.stem for p in out.glob("*.hdf5")}
    quarantined = set()
    if (out / "quarantine.jsonl").exists():
        quarantined = {json.loads(x)["video_id"] for x in (out / "quarantine.jsonl").read_text().splitlines()}
    assert manifest == complete | quarantined, manifest - complete - quarantined
    assert not complete & quarantined
    # Once the run's end is whole (its record's last write), a temporary left is a torn write.
    wait_for_run_end(out, 60)
    assert not list(out.rglob("*.tmp")), list(out.rglob("*.tmp"))
    if complete:
        check = run_script("verify_dataset.py", str(out), env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
        assert check.returncode == 0, check.stdout + check.stderr
    stats = yaml.safe_load((out / "normalization_stats.yaml").read_text())
    summary = json.loads((out / "run_summary.json").read_text())
    # Each video counted once in Redis and once in the run's outcomes files, and both say the same.
    assert "outcomes_unmatched" not in summary, summary["outcomes_unmatched"]
    from tasks.records import manifest as manifests

    recorded = {e["video_id"]: e.get("status") for e in manifests.read(out)["videos"]}
    assert {recorded.get(vid) for vid in summary["done_videos"]} <= {"done"}, recorded
    # and every complete video, an earlier run's too (one Redis lost: tasks.records.outcome_files.adopt_lost)
    assert {recorded.get(vid) for vid in complete} <= {"done"}, recorded
    if reference is not None and not quarantined:
        assert stats.keys() == reference.keys()
        for key, value in reference.items():
            got = stats[key]
            if isinstance(value, list):
                assert all(abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300) for a, b in zip(got, value, strict=True))
            elif isinstance(value, float):
                assert abs(got - value) <= 1e-9 * max(abs(got), abs(value), 1e-300), key
            else:
                assert got == value, key
    return stats


def stage_runs(logs: Path) -> dict[tuple[str, str], int]:
    """How many times each (stage, video) actually ran, from every worker log ("ran <stage> of <video>")."""
    counts: dict[tuple[str, str], int] = {}
    for log in logs.rglob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "] ran " in line:
                _, _, rest = line.partition("] ran ")
                stage, _, vid = rest.partition(" of ")
                counts[(stage, vid.strip())] = counts.get((stage, vid.strip()), 0) + 1
    return counts


def copy_raw(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def twice(logs: Path) -> dict[tuple[str, str], int]:
    """The (stage, video) pairs that ran more than once."""
    return {k: n for k, n in stage_runs(logs).items() if n > 1}

"""Shared fixtures: a Redis database of the tests' own, real videos, real worker processes."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis

# The tests' videos are drawn shapes: they name the synthetic backends, in this process and in every
# worker and script it starts (a test of a real backend names that backend in its settings).
os.environ["FRAMEFLEET_DEFAULT_BACKENDS"] = "synthetic"

ROOT = Path(__file__).resolve().parent.parent
# This session's own host state (the roots `framefleet enqueue` allows, tasks.workers.confinement): never
# the user's home, never another session's.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="framefleet-state-")
# The workers the tests start are confined, as every worker is: they read videos wherever the tests keep
# them (shared clips included) and write only under the temp folder. A test of the other modes drops these.
CONFINED_ENV = {"FRAMEFLEET_DATASET_ROOT": "/", "FRAMEFLEET_OUTPUT_ROOT": str(Path(tempfile.gettempdir()).resolve())}
# The tests' workers also serve jobs sent by hand into folders without a run record (tasks.pipeline.admission);
# the tests of that check start theirs without it (UNRECORDED_ENV removed), and a run enqueued is checked anyway.
UNRECORDED_ENV = {"FRAMEFLEET_UNRECORDED_RUNS": "1"}
sys.path.insert(0, str(ROOT))

from tasks.cli.sample import make_video  # noqa: E402
from tasks.redis_client import free_port, server_argv  # noqa: E402


def _start_private_redis() -> str:
    """Start a redis-server of this test session on a free port; it ends when the session does.

    Two test sessions on one machine never share a database, and no Redis needs to be running
    beforehand. $FRAMEFLEET_TEST_REDIS (redis://host:port) points the tests at another server.
    """
    url, stop = start_redis_server()
    atexit.register(stop)
    return url


def start_redis_server() -> tuple[str, Callable[[], None]]:
    """Start a redis-server on a free port: its URL and the function that stops it (and removes its folder)."""
    if shutil.which("redis-server") is None:
        raise RuntimeError(
            "the tests start their own redis-server and none is installed: "
            "`apt install redis-server` (or `brew install redis`), or set FRAMEFLEET_TEST_REDIS"
        )
    folder = tempfile.mkdtemp(prefix="framefleet-test-redis-")
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [*server_argv(port, folder), "--databases", "32"],
            stdout=open(Path(folder) / "redis.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        client = redis.Redis(port=port)
        for _ in range(200):
            if proc.poll() is not None:
                break  # the port was taken in between: try another
            try:
                client.ping()
            except redis.ConnectionError:
                time.sleep(0.025)
                continue

            def stop(proc: subprocess.Popen[bytes] = proc) -> None:
                proc.terminate()
                proc.wait(timeout=10)
                shutil.rmtree(folder, ignore_errors=True)

            return f"redis://127.0.0.1:{port}", stop
        proc.kill()
    raise RuntimeError(f"the tests' private redis-server did not start; see {folder}/redis.log")


BASE_REDIS = os.environ.get("FRAMEFLEET_TEST_REDIS") or _start_private_redis()
TEST_DB = int(os.environ.get("FRAMEFLEET_TEST_DB", "11"))
SHARED_DB = TEST_DB + 2  # the database of the session's shared workers (TEST_DB + 1 is test_routing_live's broker)
# The shared gpu0 worker's one setting of its own: a model worker's torch threads (outputs do not depend on it);
# one thread keeps it from oversubscribing a small, busy machine.
CLUSTER_GPU_ENV = {"FRAMEFLEET_TORCH_THREADS": "1"}
PIPELINE_ENV = ("REDIS_URL", "FRAMEFLEET_CONFIG", "FRAMEFLEET_REDIS_URL", "CUDA_VISIBLE_DEVICES")


# CI (.ci/run, as root) sets this: a test that needs root, a tmpfs or network namespaces then fails instead of
# skipping when it cannot have them, so CI never passes by skipping what it is there to run.
NO_PRIVILEGED_SKIPS = os.environ.get("FRAMEFLEET_CI") == "1"


# Fixtures that start real worker processes (or runs of them): a test using one takes seconds to minutes.
REAL_WORKER_FIXTURES = frozenset({"workers", "cluster", "fault_workers", "pipeline_env"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with the most real-worker tests first, each file's tests in their own order: `make test` hands
    out whole files (--dist loadfile), and a long file handed out last would run alone at the suite's end."""
    weight = Counter(item.path for item in items if REAL_WORKER_FIXTURES & set(getattr(item, "fixturenames", ())))
    items.sort(key=lambda item: -weight[item.path])  # stable: files stay whole and keep their order among equals


def skip_unless_ci(reason: str) -> None:
    """Skip this test for ``reason`` (which says what it needs, e.g. root); under CI (FRAMEFLEET_CI=1), fail instead."""
    if NO_PRIVILEGED_SKIPS:
        pytest.fail(f"{reason}; FRAMEFLEET_CI=1 (CI runs as root) requires this test to run, not skip")
    pytest.skip(reason)


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.1) -> object:
    """Poll ``condition`` until it returns something truthy; fail the test naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def wait_for_run_end(out: Path, timeout_s: float, run_id: str | None = None) -> dict:
    """Wait until the run's end has written everything it writes (its record "finished": the end's last write,
    tasks.run.runs.ended), not just one of its files; return its run_summary.json. ``run_id``: the run (default:
    the one whose summary OUT holds)."""
    from tasks.run import runs

    def summary() -> dict | None:
        try:
            found = json.loads((out / "run_summary.json").read_text())
        except (OSError, ValueError):
            return None
        if run_id is not None and found.get("run_id") != run_id:
            return None
        return found if runs.ended(out, found["run_id"]) else None

    return wait_until(summary, timeout_s, f"the end of the run in {out}", poll_s=0.2)  # type: ignore[return-value]


# run_local's worker counts for a test that needs no more than one of each (its default, a CPU worker and a
# stand-in for gpu0 per core, is test_pipeline_e2e's): fewer processes to start on a small, busy machine.
ONE_WORKER_EACH = ("--cpu-workers", "1", "--gpu-workers", "1")


def settings_env(tmp_path: Path, yaml_text: str, **extra: str) -> dict[str, str]:
    """Environment for workers and scripts that read this YAML settings text (plus ``extra``)."""
    config = tmp_path / "settings.yaml"
    config.write_text(yaml_text)
    return {"FRAMEFLEET_CONFIG": str(config), **extra}


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A flushed Redis database used by this test alone."""
    from tasks.statistics import sums

    url = f"{BASE_REDIS}/{TEST_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    sums.forget_run_shards()  # run ids repeat from test to test: a shard count read before is not this run's
    yield url
    client.flushdb()
    sums.forget_run_shards()


@pytest.fixture
def decoy() -> Iterator[str]:
    """Another Redis that answers (no password), as one at the default address does on many machines; its URL."""
    url, stop = start_redis_server()
    try:
        yield url + "/0"
    finally:
        stop()


@pytest.fixture
def app_on_test_redis(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, redis.Redis]:
    """This process's Celery app and settings pointed at the test's Redis: (settings, a decoding client)."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    from tasks import configure
    from worker_config.settings import load_settings

    conf = load_settings()
    configure(conf)
    return conf, redis.Redis.from_url(redis_url, decode_responses=True)


def process_env(url: str) -> dict[str, str]:
    """Environment for framefleet processes on the Redis database ``url``, with fast liveness settings."""
    env = {k: v for k, v in os.environ.items() if k not in PIPELINE_ENV}
    # The project first, then whatever the caller's PYTHONPATH holds (the GPU machine's packages live there).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update(
        REDIS_URL=url,
        PYTHONPATH=path,
        FRAMEFLEET_HEARTBEAT_INTERVAL_S="0.5",
        FRAMEFLEET_REGISTRY_TTL_S="3",
        PYTHONUNBUFFERED="1",
        **CONFINED_ENV,
        **UNRECORDED_ENV,
    )
    return env


@pytest.fixture
def pipeline_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for framefleet processes: this test's Redis and fast liveness settings."""
    return process_env(redis_url)


@pytest.fixture(scope="session")
def video_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Make a folder of ``n`` short real H.264 videos (cached per arguments within a session).

    Clip ``i`` of a given length is the same file in every folder, so each is encoded once per
    session and hard-linked into the folders that hold it (tests copy a folder before changing it).
    """
    folders: dict[tuple[int, float], Path] = {}
    clips: dict[tuple[int, float], Path] = {}
    sizes = ((640, 360), (480, 360), (640, 480))

    def clip(i: int, seconds: float) -> Path:
        if (i, seconds) not in clips:
            w, h = sizes[i % len(sizes)]
            path = tmp_path_factory.mktemp("clips") / f"clip {i:02d}.mp4"
            clips[(i, seconds)] = make_video(path, w, h, (24, 30, 15)[i % 3], seconds, seed=100 + i)
        return clips[(i, seconds)]

    def make(n: int, seconds: float = 1.6) -> Path:
        if (n, seconds) not in folders:
            folder = tmp_path_factory.mktemp(f"raw{n}")
            for i in range(n):
                source = clip(i, seconds)
                try:
                    os.link(source, folder / source.name)
                except OSError:  # another file system, or no hard links there
                    shutil.copyfile(source, folder / source.name)
            folders[(n, seconds)] = folder
        return folders[(n, seconds)]

    return make


class Workers:
    """Real ``celery worker`` processes of one test; every one is stopped at teardown."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        queue: str,
        name: str | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        wait: bool = True,
        python: str | None = None,
        extra: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        """Start a worker on ``queue``; ``python`` names another environment's interpreter (default: this one);
        ``extra``: more worker options (``-I MODULE`` loads a fault point)."""
        name = name or queue
        args = ["-Q", queue, "-P", pool, "-c", str(concurrency), "-n", f"{name}@test", "-E", "--without-gossip"]
        args += ["--without-mingle", "--loglevel", "INFO", *extra]
        proc = self.launch(name, args, env, python)
        if wait:
            wait_until(lambda: self.state(name) or proc.poll() is not None, 60, f"worker {name} to register")
            if proc.poll() is not None:
                pytest.fail(f"worker {name} exited with {proc.returncode}:\n{self.log(name)}")
        return proc

    def launch(
        self, name: str, args: list[str], env: dict[str, str] | None = None, python: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``celery -A tasks worker ARGS`` as a user types it, logging to ``log(name)``; do not wait."""
        self.logs.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [python or sys.executable, "-m", "celery", "-A", "tasks", "worker", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=open(self.logs / f"{name}.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def state(self, name: str) -> dict | None:
        from tasks.redis_client import connect

        raw = connect(self.env["REDIS_URL"]).get(f"ff:worker:{name}@test")
        return json.loads(raw) if raw else None

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def stop_all(self) -> None:
        """End every worker at once (SIGKILL to its process group, pool children included).

        The test is over: a warm shutdown here would only wait for whatever task is in hand (a
        test that checks warm shutdown calls ``stop`` with SIGTERM itself), and the test's Redis
        database and folders are discarded with it.
        """
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait(timeout=30)


@pytest.fixture
def workers(pipeline_env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(pipeline_env, tmp_path / "logs")
    yield pool
    pool.stop_all()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """One ``cpu`` and one ``gpu0`` worker with the default settings (but CLUSTER_GPU_ENV), shared by a session's tests.

    For tests whose runs need nothing more: each run has its own output folder and run id, so its
    records, files and summary are its alone. A test that changes settings, stops or counts workers,
    or reads queue lengths or the whole database starts its own with ``workers``. The workers'
    environment (its REDIS_URL a database of their own) is ``cluster.env``. Starting a model worker
    (torch, the models) costs seconds on every test that would otherwise start one.
    """
    url = f"{BASE_REDIS}/{SHARED_DB}"
    redis.Redis.from_url(url).flushdb()
    pool = Workers(process_env(url), tmp_path_factory.mktemp("cluster") / "logs")
    try:
        pool.start("cpu", wait=False)
        pool.start("gpu0", env=CLUSTER_GPU_ENV, wait=False)
        for name in ("cpu", "gpu0"):
            wait_until(
                lambda name=name: pool.state(name) or pool.procs[name].poll() is not None,
                60,
                f"the shared {name} worker to register",
            )
            if pool.procs[name].poll() is not None:
                pytest.fail(f"the shared {name} worker exited:\n{pool.log(name)}")
        yield pool
    finally:
        pool.stop_all()
        redis.Redis.from_url(url).flushdb()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """moto's S3 server for the session (tests/s3_server.py), stopped at its end; its environment (endpoint, a
    valid key, the object cache) is this process's and every process's the tests start while it runs."""
    from tests.s3_server import running

    base = tmp_path_factory.mktemp("s3")
    with running(base / "logs", base / "objects") as server:
        saved = {key: os.environ.get(key) for key in server.env}
        os.environ.update(server.env)
        try:
            yield server
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def send_task(url: str, name: str, args: tuple, queue: str, **options: object) -> str:
    """Send a task message to the Redis at ``url`` as a producer would; return its id.

    A Celery app of its own, so the tests' process never caches a broker or result backend
    of one test's Redis in the shared ``tasks`` app.
    """
    from celery import Celery

    sender = Celery("test-sender", broker=url, backend=url, set_as_current=False)
    sender.conf.update(task_serializer="json", accept_content=["json"])
    try:
        return sender.send_task(name, args=args, queue=queue, **options).id
    finally:
        sender.close()


def task_result(url: str, task_id: str) -> dict | None:
    """The stored meta of a finished task (status SUCCESS or FAILURE), read straight from Redis."""
    raw = redis.Redis.from_url(url).get(f"celery-task-meta-{task_id}")
    meta = json.loads(raw) if raw else {}
    return meta if meta.get("status") in ("SUCCESS", "FAILURE") else None


def enqueue_and_watch(raw: Path, out: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``scripts/enqueue_dataset.py RAW --out OUT`` started as a user would, following its run to the end: the
    process, its output (stdout and stderr together) to read with ``communicate``."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "enqueue_dataset.py"), str(raw), "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_script(script: str, *args: str, env: dict[str, str], timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Run ``scripts/<script>`` as a user would; return the completed process (text output)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _interrupt_state() -> tuple[object, bool]:
    """How this process takes SIGINT: its handler, and whether the signal is blocked (both pass to the
    processes a test starts: a child started while SIGINT is ignored or blocked never sees a Ctrl-C)."""
    return signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.fixture(autouse=True)
def _ctrl_c_left_as_found() -> Iterator[None]:
    """A test that leaves the test process ignoring or blocking Ctrl-C fails, by name, and the state is put
    back: otherwise a later test of the same session, which sends SIGINT to a command it started, fails
    instead."""
    before = _interrupt_state()
    yield
    after = _interrupt_state()
    if after != before:
        signal.signal(signal.SIGINT, before[0])  # type: ignore[arg-type]
        signal.pthread_sigmask(signal.SIG_UNBLOCK if not before[1] else signal.SIG_BLOCK, [signal.SIGINT])
        pytest.fail(f"this test left SIGINT as {after} (handler, blocked), found as {before}")

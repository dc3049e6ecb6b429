"""The autoscaler against real Redis, real worker processes and a fake GPU ledger (no GPU needed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tasks.autoscaler import profiles
from tasks.autoscaler.supervisor import Supervisor
from tasks.delivery import queues
from tasks.gpu.fake import LEDGER_ENV, FakeGpuLedger
from tasks.stages import GPU_STAGES
from tasks.workers.registry import live_workers
from tests.conftest import ROOT, run_script, skip_unless_ci, wait_until
from worker_config.settings import load_settings

# Scaled down from a 10000 MiB GPU: hold 200 + activation 100 = a 300 MiB peak, 100 MiB headroom,
# so floor((1000 - 100) / 300) = 3 workers fit.
TOTAL_MIB, PEAK_MIB = 1000, 300
DEPTH = "stages:\n  depth:\n    params: {hold_mib: 200, activation_mib: 100, matmuls_per_frame: 10}\n"
FAST = [
    "--tick-s",
    "0.5",
    "--cooldown-s",
    "1",
    "--headroom-mib",
    "100",
    "--pressure-free-mib",
    "20",
    "--idle-scale-down-s",
    "600",
    "--max-workers-per-gpu",
    "6",
    "--stop-grace-s",
    "60",
]


class Autoscaler:
    """scripts/autoscaler.py as a child process; stopped (and its workers with it) at teardown."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env, self.tmp = env, tmp
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / "autoscaler.log"

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "scripts" / "autoscaler.py"), "--log-dir", str(self.tmp / "logs"), *args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.proc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 60) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"the autoscaler did not stop within {timeout_s} s:\n{self.log()[-3000:]}")


@pytest.fixture
def autoscaler(pipeline_env: dict[str, str], tmp_path: Path) -> Iterator[Autoscaler]:
    runner = Autoscaler({k: v for k, v in pipeline_env.items() if k != LEDGER_ENV}, tmp_path)
    yield runner
    if runner.proc is not None and runner.proc.poll() is None:
        runner.stop()
    for pid in worker_pids(redis.Redis.from_url(pipeline_env["REDIS_URL"])):
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


def decisions(r: redis.Redis) -> list[dict]:
    return [json.loads(raw) for raw in r.lrange("ff:autoscale", 0, -1)]


def worker_pids(r: redis.Redis) -> set[int]:
    return {d["worker_pid"] for d in decisions(r) if d.get("worker_pid")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"


def gpu0_workers(r: redis.Redis) -> list[dict]:
    return [w for w in live_workers(r) if w.get("gpu") == 0 and w["hostname"].startswith("gpu0-")]


def make_ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.json"
    FakeGpuLedger.create(path, [{"total_mib": TOTAL_MIB, "name": "Fake GPU 1GB"}])
    return path


def enqueue(raw: Path, out: Path, env: dict[str, str], tmp_path: Path) -> subprocess.Popen[bytes]:
    """Send the run and wait for it in a child process (its output in tmp_path/enqueue.log)."""
    with open(tmp_path / "enqueue.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "enqueue_dataset.py"), str(raw), "--out", str(out)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def finished_summary(enqueuer: subprocess.Popen[bytes], out: Path, tmp_path: Path, videos: int) -> dict:
    assert enqueuer.wait(timeout=120) == 0, (tmp_path / "enqueue.log").read_text()
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["failed"] == [] and summary["done"] == summary["videos"] == videos, summary
    return summary


@pytest.mark.timeout(180)
def test_packs_to_capacity_learns_the_peak_and_stops_every_worker(
    video_factory, workers, pipeline_env, autoscaler, r, tmp_path
):
    ledger, config = make_ledger(tmp_path), tmp_path / "depth.yaml"
    config.write_text(DEPTH)
    env = {**pipeline_env, "FRAMEFLEET_CONFIG": str(config)}
    workers.start("cpu", env={"FRAMEFLEET_CONFIG": str(config)})
    proc = autoscaler.start("--fake-gpu", str(ledger), "--config", str(config), *FAST)
    wait_until(lambda: gpu0_workers(r), 60, "the first gpu0 worker")
    out = tmp_path / "out"
    enqueuer = enqueue(video_factory(6), out, env, tmp_path)
    most, most_on_gpu = 0, 0
    deadline = time.monotonic() + 150
    while enqueuer.poll() is None and time.monotonic() < deadline:
        most = max(most, len(gpu0_workers(r)))
        most_on_gpu = max(most_on_gpu, len({p.pid for p in FakeGpuLedger(ledger).readings()[1]}))
        time.sleep(0.1)
    finished_summary(enqueuer, out, tmp_path, 6)
    assert proc.poll() is None, autoscaler.log()
    assert most == 3 and most_on_gpu == 3, (most, most_on_gpu, autoscaler.log()[-4000:])
    made = decisions(r)
    ups = [d for d in made if d["action"] == "up"]
    assert [d["action"] for d in made] == ["up"] * 3, autoscaler.log()[-4000:]
    assert "below the minimum" in ups[0]["reason"] and ups[0]["peak_mib"] is None
    for d in ups[1:]:
        assert d["peak_mib"] == PEAK_MIB and d["capacity"] == 3 and d["backlog"] > d["workers"] + d["starting"]
        assert {"free_mib", "used_mib", "other_used_mib", "host_free_mib", "worker_rss_mib"} <= set(d)
    assert {d["worker"] for d in ups} == {"gpu0-1", "gpu0-2", "gpu0-3"}
    key = profiles.key_for(load_settings(config), "Fake GPU 1GB", load_settings(config).hosted_stages())
    assert key == "Fake GPU 1GB|depth+tracks+hands|synthetic|512x384"
    assert profiles.load(r, key).peak_mib == PEAK_MIB  # the activation is in the learned peak

    pids = worker_pids(r)
    assert len(pids) == 3 and all(alive(pid) for pid in pids)
    assert autoscaler.stop() == 0, autoscaler.log()
    assert not [pid for pid in pids if alive(pid)]
    assert gpu0_workers(r) == [] and FakeGpuLedger(ledger).readings()[1] == []
    assert "all workers stopped" in autoscaler.log()


@pytest.mark.timeout(180)
def test_an_oom_raises_the_peak_scales_down_and_loses_nothing(
    video_factory, workers, pipeline_env, autoscaler, r, tmp_path
):
    ledger, config = make_ledger(tmp_path), tmp_path / "depth.yaml"
    config.write_text(DEPTH)
    env = {**pipeline_env, "FRAMEFLEET_CONFIG": str(config)}
    # A profile from an earlier run: the autoscaler goes straight to 3 workers.
    key = profiles.key_for(load_settings(config), "Fake GPU 1GB", load_settings(config).hosted_stages())
    profiles.learn(r, key, PEAK_MIB)
    workers.start("cpu", env={"FRAMEFLEET_CONFIG": str(config)})
    autoscaler.start("--fake-gpu", str(ledger), "--config", str(config), *FAST)
    out = tmp_path / "out"
    enqueuer = enqueue(video_factory(6), out, env, tmp_path)
    wait_until(lambda: len(gpu0_workers(r)) == 3, 90, "3 gpu0 workers")
    assert [d["action"] for d in decisions(r)] == ["up"] * 3
    # Now 3 workers' holds (600 MiB) plus one activation (100 MiB) pass the GPU's limit.
    FakeGpuLedger(ledger).set_oom_at(0, 650)
    wait_until(lambda: r.llen("ff:oom"), 60, "an OOM record")
    down = wait_until(lambda: [d for d in decisions(r) if d["action"] == "down"], 30, "a scale-down")[0]
    assert "out of memory" in down["reason"] and down["recent_oom"] is True, down
    assert down["peak_mib"] >= PEAK_MIB * 1.25 and down["capacity"] == 2
    finished_summary(enqueuer, out, tmp_path, 6)
    ooms = [json.loads(raw) for raw in r.lrange("ff:oom", 0, -1)]
    assert {o["stage"] for o in ooms} <= set(GPU_STAGES) and all(o["gpu"] == 0 for o in ooms)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("gpu0-*.log"))
    assert "GpuOutOfMemory" in logs and "retry 1 of 3" in logs  # the OOMed task was retried
    assert len(gpu0_workers(r)) == 2
    assert [d["action"] for d in decisions(r)] == ["up"] * 3 + ["down"], autoscaler.log()[-4000:]
    assert profiles.load(r, key).peak_mib >= PEAK_MIB * 1.25
    assert autoscaler.stop() == 0
    assert not [pid for pid in worker_pids(r) if alive(pid)]


@pytest.mark.timeout(120)
def test_without_a_gpu_it_runs_in_cpu_mode_and_keeps_a_stand_in_alive(pipeline_env, autoscaler, r):
    from tasks.gpu import open_probe

    probe = open_probe(None) if not os.environ.get(LEDGER_ENV) else None
    if probe is not None and probe.mode == "nvml":
        probe.close()
        # A GPU cannot be taken out of a GPU machine; CI's machines have none, so there it fails.
        skip_unless_ci("NVML sees a GPU here: CPU mode needs a machine without one")
    autoscaler.start("--tick-s", "0.5")
    first = wait_until(lambda: gpu0_workers(r), 60, "the stand-in gpu0 worker")[0]
    assert "CPU mode" in autoscaler.log() and first["device"] == "cpu"
    os.killpg(first["pid"], signal.SIGKILL)
    again = wait_until(lambda: [w for w in gpu0_workers(r) if w["pid"] != first["pid"]], 60, "a restart")
    assert again[0]["hostname"] == first["hostname"] and len(gpu0_workers(r)) == 1
    assert [d["action"] for d in decisions(r)] == ["up", "restart"]
    assert "restarting in 1 s" in autoscaler.log()
    assert autoscaler.stop() == 0
    assert not alive(again[0]["pid"])


def test_supervisor_restarts_with_exponential_backoff_and_a_recycled_worker_at_once(tmp_path):
    now = [0.0]
    code = ["1"]
    sup = Supervisor(
        lambda gpu, name: [sys.executable, "-c", f"raise SystemExit({code[0]})"],
        lambda gpu: dict(os.environ),
        tmp_path,
        clock=lambda: now[0],
    )
    slot = sup.start(0, "gpu0")
    delays = []
    for _ in range(8):
        slot.proc.wait()
        assert [what for what, _, _ in sup.reap()] == ["exited"]
        delays.append(slot.restart_at - now[0])
        now[0] = slot.restart_at - 0.01
        assert sup.reap() == []
        now[0] = slot.restart_at
        assert [what for what, _, _ in sup.reap()] == ["restarted"]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]
    code[0] = "0"
    slot.proc.wait()  # this one still exits 1
    sup.reap()
    now[0] = slot.restart_at
    sup.reap()
    slot.proc.wait()
    assert [what for what, _, _ in sup.reap()] == ["exited", "restarted"] and slot.failures == 0
    code[0] = "1"
    slot.proc.wait()
    assert [what for what, _, _ in sup.reap()] == ["exited", "restarted"]
    slot.proc.wait()
    assert [what for what, _, _ in sup.reap()] == ["exited"] and slot.restart_at == now[0] + 1
    assert sup.stop_newest(0) is slot and sup.slots == []  # waiting for its restart: just dropped


def test_supervisor_stops_warm_then_kills_after_the_grace(tmp_path):
    now = [0.0]
    stubborn = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"
    )
    sup = Supervisor(
        lambda gpu, name: [sys.executable, "-c", stubborn, str(tmp_path / name)],
        lambda gpu: dict(os.environ),
        None,
        stop_grace_s=30,
        clock=lambda: now[0],
    )
    first, second = sup.start(1, "gpu1"), sup.start(1, "gpu1")
    assert (first.name, second.name) == ("gpu1-1", "gpu1-2")
    for name in ("gpu1-1", "gpu1-2"):
        wait_until((tmp_path / name).exists, 20, f"{name} to ignore SIGTERM")
    assert sup.stop_newest(1) is second and sup.active(1) == [first] and sup.stopping(1) == [second]
    now[0] = 29
    assert sup.reap() == []
    now[0] = 31
    assert [what for what, _, _ in sup.reap()] == ["killed"]
    second.proc.wait(timeout=10)
    assert [what for what, _, _ in sup.reap()] == ["stopped"] and sup.slots == [first]
    sup.stop_all(grace_s=0.5)
    assert first.proc.returncode == -signal.SIGKILL and sup.slots == []


def test_profiles_keep_the_largest_peak_and_rise_after_an_oom(r):
    key = profiles.profile_key("NVIDIA H100 80GB HBM3", ("depth", "tracks", "hands"), "synthetic", "512x384")
    assert key == "NVIDIA H100 80GB HBM3|depth+tracks+hands|synthetic|512x384"
    assert profiles.load(r, key) is None
    assert profiles.learn(r, key, 14_000).peak_mib == 14_000
    assert profiles.learn(r, key, 12_000).peak_mib == 14_000
    stored = profiles.load(r, key)
    assert stored.peak_mib == 14_000 and stored.samples == 2 and stored.updated > time.time() - 60
    assert profiles.raise_after_oom(r, key, 15_000).peak_mib == 17_500
    assert profiles.raise_after_oom(r, key, 30_000).peak_mib == 30_000
    assert json.loads(r.hget("ff:profiles", key))["peak_mib"] == 30_000
    r.hset("ff:profiles", "broken", "not json")
    assert profiles.load(r, "broken") is None
    assert profiles.learn(r, "broken", 100).peak_mib == 100
    conf = load_settings()
    assert profiles.key_for(conf, "X", ["depth"]) == "X|depth|synthetic|512x384"


def test_tick_packs_around_other_processes_and_answers_pressure_and_oom(redis_url, r, monkeypatch, tmp_path):
    """Autoscaler.tick in this process: stand-in worker processes, registry entries and ledger use by hand."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    from tasks import configure
    from tasks.autoscaler.policy import AutoscalePolicy
    from tasks.autoscaler.service import Autoscaler as Scaler
    from tasks.gpu import FakeProbe
    from tasks.workers.registry import publish

    conf = load_settings()
    configure(conf)
    ledger = FakeGpuLedger.create(tmp_path / "ledger.json", [{"total_mib": 10_000, "name": "Fake GPU 10GB"}])
    now = [0.0]
    sup = Supervisor(
        lambda gpu, name: [sys.executable, "-c", "import time; time.sleep(120)"],
        lambda gpu: dict(os.environ),
        None,
        stop_grace_s=5,
        clock=lambda: now[0],
    )
    policy = AutoscalePolicy(headroom_mib=1000, cooldown_s=10, max_workers_per_gpu=8)
    wall = lambda: 1_800_000_000 + now[0]  # noqa: E731  (wall time, as OOM records carry it)
    scaler = Scaler(conf, policy, FakeProbe(ledger), sup, clock=lambda: now[0], wall=wall)
    loaded: set[int] = set()

    def tick(seconds: float = 11.0, tasks_done: int = 1):
        now[0] += seconds
        for slot in sup.active(0):  # each worker registers and holds 3000 MiB
            publish(
                r,
                {
                    "hostname": f"{slot.name}@test",
                    "pid": slot.pid,
                    "gpu": 0,
                    "gpu_queues": ["gpu0"],
                    "busy": True,
                    "tasks_done": tasks_done,
                    "gpu_peak_mib": 3000.0,
                },
                ttl_s=60,
            )
            if slot.pid not in loaded:
                ledger.allocate(0, 3000, pid=slot.pid)
                loaded.add(slot.pid)
        return scaler.tick()[0]

    events = EventCapture()
    try:
        events.start_listening()
        r.rpush("gpu0", *["waiting"] * 20)
        assert tick().action == "up"
        assert "no learned peak" in tick(tasks_done=0).reason
        actions = [tick().action for _ in range(5)]
        # the peak known, both workers that still fit start in one tick
        assert actions == ["up", "hold", "hold", "hold", "hold"] and len(sup.active(0)) == 3
        assert "does not fit" in tick().reason
        ledger.allocate(0, 900)  # another program takes 900 MiB: 100 MiB left
        decision = tick(seconds=0.5)  # memory pressure does not wait for the cooldown
        assert decision.action == "down" and decision.readings["other_used_mib"] == 900
        wait_until(lambda: all(s.proc.poll() is not None for s in sup.stopping(0)), 10, "the worker to exit")
        decision = tick()
        assert decision.readings["workers"] == 2 and "does not fit" in decision.reason
        now[0] += policy.cooldown_s + 1  # OOMs within a cooldown of a worker leaving are its echoes
        victim = sup.active(0)[0]
        oom = {"gpu": 0, "worker": f"{victim.name}@test", "pid": victim.pid, "stage": "depth", "peak_mib": 3100.0}
        r.lpush("ff:oom", json.dumps({**oom, "time": wall()}))
        decision = tick()  # 2 x 3750 + 900 still fit: nothing to remove, nothing to add
        assert decision.action == "hold" and decision.reason.startswith("out of memory recently")
        assert decision.readings["peak_mib"] == 3750
        r.lpush("ff:oom", json.dumps({**oom, "time": wall()}))
        decision = tick()
        assert decision.action == "down" and "out of memory" in decision.reason
        assert decision.readings["peak_mib"] == 4687.5 and decision.readings["capacity"] == 1
        made = decisions(r)
        assert [d["action"] for d in made] == ["up", "up", "up", "down", "down"]
        assert made[3]["reason"].startswith("memory pressure") and made[3]["worker"] == "gpu0-3"
        sent = wait_until(
            lambda: events.of("autoscale-") if len(events.of("autoscale-")) == 5 else None,
            10,
            "the five autoscale events",
        )
        assert [e["type"] for e in sent] == ["autoscale-up"] * 3 + ["autoscale-down"] * 2
        assert sent[4]["hostname"].startswith("autoscaler@") and sent[4]["capacity"] == 1
    finally:
        events.stop()
        sup.stop_all(grace_s=5)
        scaler.shutdown()


class EventCapture(threading.Thread):
    """Celery events as a monitor (Flower) receives them."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.events: list[dict] = []
        self.receiver = None

    def run(self) -> None:
        from tasks import app

        with app.connection() as conn:
            self.receiver = app.events.Receiver(conn, handlers={"*": self.events.append})
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def start_listening(self) -> None:
        """Start, and return once a probe event sent now is received (the subscription is live)."""
        from tasks import app

        self.start()
        with app.connection_for_write() as conn:
            probe = app.events.Dispatcher(conn, hostname="test@probe", enabled=True)

            def received() -> bool:
                probe.send("test-probe")
                return bool(self.of("test-probe"))

            wait_until(received, 20, "the event receiver to subscribe", poll_s=0.2)
            probe.close()

    def of(self, prefix: str) -> list[dict]:
        return [e for e in list(self.events) if e.get("type", "").startswith(prefix)]

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.join(timeout=10)


def hands_workers(r: redis.Redis) -> list[dict]:
    return [w for w in live_workers(r) if w.get("gpu") == 0 and w["hostname"].startswith("gpu0.hands-")]


@pytest.mark.timeout(300)
def test_a_stage_with_its_own_python_is_a_family_of_its_own(
    video_factory, workers, pipeline_env, autoscaler, r, tmp_path
):
    """gpu0 (depth, tracks) and gpu0.hands (from a second venv): separate peaks, backlogs and counts, each family
    growing on its own backlog around the other's memory, never past what the GPU holds."""
    from tests.test_stage_envs import stage_env

    env_dir = stage_env()
    # Main family: 200 + 100 = a 300 MiB peak; hands: 100 + 50 = 150 MiB; 900 MiB usable. Which family grows
    # first is the policy's answer to the timings (tasks.autoscaler.chain): on a quiet host gpu0 learned its
    # peak while hands had no task yet and grew to 2, then hands to 2 (2 x 300 + 2 x 150); on a loaded one
    # hands had a task running by then, gpu0 waited for it (learn_first), its backlog was gone when hands'
    # first task ended, and hands, ten times slower, grew to 3. Both are right; what holds either way is below.
    ledger, config = make_ledger(tmp_path), tmp_path / "families.yaml"
    config.write_text(
        DEPTH + f"  hands:\n    backend: envonly\n    python: {env_dir / 'bin' / 'python'}\n"
        "    params: {hold_mib: 100, activation_mib: 50, matmuls_per_frame: 60}\n"
    )
    conf = load_settings(config)
    env = {**pipeline_env, "FRAMEFLEET_CONFIG": str(config)}
    workers.start("cpu", env={"FRAMEFLEET_CONFIG": str(config)})
    out = tmp_path / "out"
    enqueuer = enqueue(video_factory(6), out, env, tmp_path)
    wait_until(lambda: queues.length(r, "gpu0") == 6 or enqueuer.poll() is not None, 120, "6 depth tasks in gpu0")
    assert enqueuer.poll() is None, (tmp_path / "enqueue.log").read_text()
    proc = autoscaler.start("--fake-gpu", str(ledger), "--config", str(config), *FAST)
    peak = {"gpu0": 300, "gpu0.hands": 150}
    most = {"gpu0": 0, "gpu0.hands": 0}
    deadline = time.monotonic() + 240
    while enqueuer.poll() is None and time.monotonic() < deadline:
        now = {"gpu0": len(gpu0_workers(r)), "gpu0.hands": len(hands_workers(r))}
        assert sum(now[q] * peak[q] for q in now) <= 900, (now, autoscaler.log()[-6000:])  # never past the GPU
        most = {q: max(most[q], now[q]) for q in most}
        time.sleep(0.1)
    finished_summary(enqueuer, out, tmp_path, 6)
    assert proc.poll() is None, autoscaler.log()

    main_key = profiles.key_for(conf, "Fake GPU 1GB", conf.hosted_stages())
    hands_key = profiles.key_for(conf, "Fake GPU 1GB", conf.hosted_stages("hands"))
    assert (main_key, hands_key) == (
        "Fake GPU 1GB|depth+tracks|synthetic|512x384",
        "Fake GPU 1GB|hands|envonly|512x384",
    )
    assert profiles.load(r, main_key).peak_mib == 300 and profiles.load(r, hands_key).peak_mib == 150
    every = decisions(r)
    assert {d["action"] for d in every} <= {"up", "down"} and r.llen("ff:oom") == 0, autoscaler.log()[-6000:]
    # A worker given back only by the throughput rule (tasks.autoscaler.benefit): its family's last join raised
    # nothing (on a loaded host two workers may share the cores) while the other family had tasks waiting.
    for d in (d for d in every if d["action"] == "down"):
        assert d["reason"].startswith("no gain from") and d["others_waiting"] > 0 and d["ceiling"] >= 1, d
    made = [d for d in every if d["action"] == "up"]
    assert [d["worker"] for d in made[:2]] == ["gpu0-1", "gpu0.hands-1"]  # each family's minimum first
    assert made[2:], f"neither family grew past one worker: {most}\n{autoscaler.log()[-6000:]}"
    for at, d in enumerate(made[2:], start=2):  # each on its own backlog and peak, around the other's memory
        queue = d["worker"].rpartition("-")[0]
        main_then = sum(1 for e in made[:at] if e["worker"].startswith("gpu0-"))
        assert d["queue"] == queue and d["backlog"] > d["workers"] + d["starting"], d
        assert d["peak_mib"] == peak[queue] and d["other_used_mib"] >= (100 if queue == "gpu0" else 300 * main_then), d
        assert (d["workers"] + d["starting"] + 1) * d["peak_mib"] + d["other_used_mib"] <= 900, d
    started = {q: sum(1 for d in made if d["worker"].rpartition("-")[0] == q) for q in most}
    given_back = any(d["action"] == "down" for d in every)
    assert most == started if not given_back else all(1 <= most[q] <= started[q] for q in most), (most, every)
    # Each worker says it is idle in its next heartbeat after its last task; status counts each family apart.
    wait_until(lambda: not any(w.get("busy") for w in live_workers(r)), 30, "the workers to be idle")
    shown = run_script("status.py", env={**env, LEDGER_ENV: str(ledger)}, timeout_s=60)
    lines = shown.stdout.splitlines()
    assert shown.returncode == 0 and ["gpu0.hands", "0"] in [line.split() for line in lines], shown.stdout
    kept = {q: started[q] - sum(1 for d in every if d["action"] == "down" and d["queue"] == q) for q in most}
    counted = f"{sum(kept.values())} (0 busy): gpu0 {kept['gpu0']}, gpu0.hands {kept['gpu0.hands']}"
    assert counted in next(line for line in lines if line.startswith("0 ")), shown.stdout
    logs = tmp_path / "logs"
    hands_logs = "".join(p.read_text(errors="replace") for p in logs.glob("gpu0.hands-*.log"))
    main_logs = "".join(p.read_text(errors="replace") for p in logs.glob("gpu0-*.log"))
    assert hands_logs.count("ran hands of") == 6 and f"envonly hands ran in {env_dir}" in hands_logs
    assert "ran hands of" not in main_logs and main_logs.count("ran depth of") == 6

    pids = worker_pids(r)
    retired = {d["worker_pid"] for d in every if d["action"] == "down"}
    assert len(pids) == sum(started.values()) and all(alive(pid) for pid in pids - retired), (pids, retired)
    assert autoscaler.stop() == 0, autoscaler.log()
    assert not [pid for pid in pids if alive(pid)]


def file_settings(out: Path, stage: str) -> list[dict]:
    """The settings each dataset file in ``out`` records for ``stage`` (its provenance)."""
    from tasks.outputs.provenance_file import read_attrs

    return [(read_attrs(p) or {})["stages"][stage]["settings"] for p in sorted(out.glob("*.hdf5"))]


@pytest.mark.timeout(300)
def test_two_runs_with_other_settings_each_get_workers_with_theirs_and_the_idle_family_goes(
    video_factory, workers, pipeline_env, autoscaler, r, tmp_path
):
    """The autoscaler's own settings serve one run; for the other's, waiting in its settings queue, it writes the
    run's recorded settings to a file, starts workers from it, and stops them once nothing waits for them."""
    ledger, own, other = make_ledger(tmp_path), tmp_path / "own.yaml", tmp_path / "other.yaml"
    own.write_text(DEPTH)
    other.write_text(DEPTH.replace("params: {", "params: {flat_std_threshold: 0.05, "))
    workers.start("cpu", env={"FRAMEFLEET_CONFIG": str(own)})  # the CPU stages' settings are the same in both
    autoscaler.start("--fake-gpu", str(ledger), "--config", str(own), *FAST, "--idle-scale-down-s", "3")
    wait_until(lambda: gpu0_workers(r), 60, "the first gpu0 worker")
    raw, runs_out = video_factory(2), {"own": tmp_path / "own", "other": tmp_path / "other"}
    sent = {}
    for name, config in (("own", own), ("other", other)):
        with open(tmp_path / f"enqueue-{name}.log", "wb") as log:
            sent[name] = subprocess.Popen(
                [sys.executable, str(ROOT / "scripts" / "enqueue_dataset.py"), str(raw), "--out", str(runs_out[name])]
                + ["--wait-for-workers"],
                cwd=ROOT,
                env={**pipeline_env, "FRAMEFLEET_CONFIG": str(config)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    for name, proc in sent.items():
        assert proc.wait(timeout=200) == 0, (tmp_path / f"enqueue-{name}.log").read_text() + autoscaler.log()[-4000:]

    # Each run's files were made under its own depth settings, by workers of its own settings.
    assert [s["params"]["flat_std_threshold"] for s in file_settings(runs_out["own"], "depth")] == [0.1, 0.1]
    assert [s["params"]["flat_std_threshold"] for s in file_settings(runs_out["other"], "depth")] == [0.05, 0.05]
    ups = [d for d in decisions(r) if d["action"] == "up"]
    (family,) = {d["queue"] for d in ups if d["queue"] != "gpu0"}
    assert family.startswith("gpu0~"), ups
    assert f"family {family} for run " in autoscaler.log() and str(tmp_path / "logs" / "settings") in autoscaler.log()
    logs = tmp_path / "logs"
    theirs = "".join(p.read_text(errors="replace") for p in logs.glob(f"{family}-*.log"))
    ours = "".join(p.read_text(errors="replace") for p in logs.glob("gpu0-*.log"))
    other_videos = json.loads((runs_out["other"] / "run_summary.json").read_text())["done_videos"]
    assert theirs.count("ran depth of") == 2 and ours.count("ran depth of") == 2, (theirs[-3000:], ours[-3000:])
    assert "sent on" not in ours + theirs  # every depth task went straight to a worker with its run's settings
    assert all(f"ran depth of {vid}" in theirs for vid in other_videos)

    # Nothing waits for the other settings any more: their family goes down to no worker, the own one stays.
    down = wait_until(lambda: [d for d in decisions(r) if d["action"] == "down" and d["queue"] == family], 60, "down")
    assert "idle for" in down[0]["reason"]
    wait_until(lambda: not [w for w in live_workers(r) if w["hostname"].startswith(family)], 60, "its worker gone")
    assert gpu0_workers(r) and autoscaler.stop() == 0, autoscaler.log()[-4000:]


CHAIN_CONFIG = (
    "stages:\n  depth:\n    params: {hold_mib: 250, activation_mib: 50, seconds_per_frame: 0.01}\n"
    "  hands:\n    python: %s\n"
    "    params: {hold_mib: 100, activation_mib: 50, seconds_per_frame: %s}\n"
)


@pytest.mark.timeout(240)
def test_the_first_family_waits_for_the_next_ones_first_task_before_it_grows(
    video_factory, workers, pipeline_env, autoscaler, r, tmp_path
):
    """gpu0 (depth, tracks: fast) feeds gpu0.hands (slow). While hands runs its first task (its time and room not
    known yet), a run's backlog on gpu0, whose peak and time are known, does not grow gpu0; the first scale-up past
    the minimum goes to hands, the slower, once that task has ended."""
    ledger, config = make_ledger(tmp_path), tmp_path / "chain.yaml"
    config.write_text(CHAIN_CONFIG % (sys.executable, 0.4))
    env = {**pipeline_env, "FRAMEFLEET_CONFIG": str(config)}
    workers.start("cpu", env={"FRAMEFLEET_CONFIG": str(config)})
    proc = autoscaler.start("--fake-gpu", str(ledger), "--config", str(config), *FAST, "--chain-horizon-s", "1")
    wait_until(lambda: gpu0_workers(r) and hands_workers(r), 90, "a gpu0 and a gpu0.hands worker")
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "raw").mkdir(parents=True), second.mkdir()
    shutil.copy(next(video_factory(1).glob("*.mp4")), first / "raw" / "alone.mp4")  # not one of the four's ids
    one = enqueue(first / "raw", first / "out", env, first)
    wait_until(lambda: any(w.get("busy") for w in hands_workers(r)), 120, "hands' first task running")
    four = enqueue(video_factory(4), second / "out", env, second)  # gpu0's backlog while hands' first task runs
    finished_summary(one, first / "out", first, 1)
    finished_summary(four, second / "out", second, 4)
    assert proc.poll() is None and r.llen("ff:oom") == 0, autoscaler.log()[-4000:]
    grown = [d for d in decisions(r) if d["action"] == "up" and "below the minimum" not in d["reason"]]
    assert grown and grown[0]["queue"] == "gpu0.hands", [(d["queue"], d["reason"]) for d in decisions(r)]
    assert grown[0]["service_s"] > 1.0 and not grown[0]["service_assumed"], grown[0]
    # the service's views said what hands held: its first task running
    assert "gpu0.hands has not ended a task yet (" in autoscaler.log(), autoscaler.log()[-4000:]


@pytest.mark.timeout(240)
def test_a_slower_family_downstream_grows_on_the_work_upstream_of_it(
    video_factory, workers, pipeline_env, autoscaler, r, tmp_path
):
    """gpu0 (depth, tracks: 300 MiB, fast) feeds gpu0.hands (150 MiB, slow): once both have run a video, a run's
    tasks waiting for gpu0 make hands grow before any reaches its own queue, and gpu0 does not take its room."""
    ledger, config = make_ledger(tmp_path), tmp_path / "chain.yaml"
    config.write_text(CHAIN_CONFIG % (sys.executable, 0.1))
    env = {**pipeline_env, "FRAMEFLEET_CONFIG": str(config)}
    workers.start("cpu", env={"FRAMEFLEET_CONFIG": str(config)})
    # three hands workers may load at once (the default, two, would leave the fourth for after the run)
    flags = ("--chain-horizon-s", "1", "--max-starting-per-gpu", "3")
    proc = autoscaler.start("--fake-gpu", str(ledger), "--config", str(config), *FAST, *flags)
    wait_until(lambda: gpu0_workers(r) and hands_workers(r), 90, "a gpu0 and a gpu0.hands worker")
    finished_summary(enqueue(video_factory(1), tmp_path / "first", env, tmp_path), tmp_path / "first", tmp_path, 1)
    assert [d["worker"] for d in decisions(r)] == ["gpu0-1", "gpu0.hands-1"], autoscaler.log()[-4000:]

    out = tmp_path / "out"
    enqueuer = enqueue(video_factory(4), out, env, tmp_path)
    most_main, most_hands = 0, 0
    while enqueuer.poll() is None:
        most_main, most_hands = max(most_main, len(gpu0_workers(r))), max(most_hands, len(hands_workers(r)))
        time.sleep(0.1)
    finished_summary(enqueuer, out, tmp_path, 4)
    assert proc.poll() is None and r.llen("ff:oom") == 0, autoscaler.log()[-4000:]
    grown = decisions(r)[2]
    assert grown["queue"] == "gpu0.hands" and grown["action"] == "up", decisions(r)
    # its own queue held no more tasks than it had workers: the tasks upstream of it (in gpu0) made it grow
    assert grown["backlog"] <= grown["workers"] + grown["starting"] and grown["upstream"] >= 1, grown
    assert "task(s) upstream" in grown["reason"] and grown["service_s"] > 1.0, grown
    # 300 + 4 x 150 MiB fill the 900 usable: hands, the chain's slowest, took the room
    assert (most_main, most_hands) == (1, 4), (most_main, most_hands, decisions(r))
    assert not [d for d in decisions(r) if d["queue"] == "gpu0" and d["action"] == "up"][1:]

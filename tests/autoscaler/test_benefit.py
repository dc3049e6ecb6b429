"""Workers where they add throughput: the fake GPU's utilisation model, the benefit trial, and the autoscaler's
tick growing a family only while the GPU has compute to spare and its last worker raised its tasks per second."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from tasks.autoscaler.benefit import Benefit
from tasks.autoscaler.policy import AutoscalePolicy, GpuView, decide
from tasks.autoscaler.supervisor import Supervisor
from tasks.gpu.fake import FakeGpuLedger, FakeNvml
from tasks.gpu.nvml import NvmlProbe
from tasks.workers.registry import publish
from worker_config.settings import load_settings

POLICY = AutoscalePolicy(headroom_mib=1000, cooldown_s=10, max_workers_per_gpu=8, max_starting_per_gpu=8)
VIEW = GpuView(
    index=0, name="Sim GPU", total_mib=20_000, used_mib=2000, free_mib=18_000, other_used_mib=0, workers=1,
    starting=0, backlog=20, peak_mib=2000, host_free_mib=256_000, worker_rss_mib=3000, queue="gpu0",
)  # fmt: skip


def test_the_fake_gpus_utilisation_is_what_its_computing_processes_ask_for_as_nvml_reports_it(tmp_path):
    ledger = FakeGpuLedger.create(tmp_path / "gpu.json", [{"total_mib": 10_000, "utilization_pct": 5}])
    probe = NvmlProbe(FakeNvml(ledger))  # the NVML probe's own code, over the ledger
    assert probe.gpus()[0].utilization_pct == 5
    ledger.set_computing(0, 60)
    ledger.set_computing(0, 70, pid=os.getppid())
    assert probe.gpus()[0].utilization_pct == 100  # time-sliced: no more than all of it
    ledger.set_computing(0, 0)
    assert probe.gpus()[0].utilization_pct == 75
    ledger.set_computing(0, 50, pid=2**22 + 7)  # a process that has ended asks for nothing
    assert probe.gpus()[0].utilization_pct == 75
    with pytest.raises(ValueError, match="0-100"):
        ledger.set_computing(0, 120)


@pytest.mark.parametrize(("busy", "action"), [(95.0, "hold"), (60.0, "up"), (None, "up")])
def test_a_busy_gpu_grows_no_family_past_its_first_worker_though_more_fit(busy, action):
    decision = decide(replace(VIEW, busy_pct=busy), POLICY, since_last_change_s=60)
    assert decision.action == action, decision.reason
    if action == "hold":
        assert "95 % busy" in decision.reason and decision.readings["busy_pct"] == 95
    # the first worker starts whatever the GPU's load
    assert decide(replace(VIEW, workers=0, busy_pct=busy), POLICY, 60).action == "up"


def test_with_min_work_per_load_a_worker_is_added_only_where_its_work_pays_for_its_load():
    """SAM 3 on an H200: 5 tasks of 6.3 s left, 33.5 s loads: a second worker would load for longer than it works."""
    policy = replace(POLICY, min_work_per_load=1.0)
    masks = replace(VIEW, backlog=5, service_s=6.3, load_s=33.5)
    held = decide(masks, policy, 60)
    assert held.action == "hold" and "32 s of work for 2 worker(s) is under 1 x the 34 s" in held.reason
    assert decide(masks, POLICY, 60).action == "up"  # off by default
    depth = replace(VIEW, backlog=8, upstream=6, service_s=24.0, load_s=48.6, workers=1)
    grown = decide(depth, replace(policy, chain_horizon_s=1000), 60)  # 336 s of work: six workers' loads pay
    assert grown.action == "up" and grown.count == 5
    assert decide(replace(depth, backlog=3, upstream=0), policy, 60).count == 1  # 72 s: one more worker's load


def serve(per_task_s: float, workers: int, seconds: float) -> dict[int, tuple[float, int]]:
    """Each of ``workers`` (pids 1..) busy for ``seconds`` at ``per_task_s`` a task."""
    return {pid: (seconds, int(seconds // per_task_s)) for pid in range(1, workers + 1)}


@pytest.mark.parametrize(("slowdown", "ceiling"), [(2.0, 1), (1.0, None), (1.5, None)])
def test_a_trial_sets_the_ceiling_where_the_last_worker_raised_no_throughput(slowdown, ceiling):
    """One worker at 10 s a task; a second joins; with both, each task takes 10 x ``slowdown`` s (2: the GPU was
    full, the family's tasks per second did not rise)."""
    b = Benefit(min_gain=0.05, trial_tasks=2)
    b.observe({1: (10.0, 1)}, {1}, now=10)  # its first task (warm-up) is not counted
    assert b.observe({1: (40.0, 4)}, {1}, now=40) == ""
    assert b.observe({1: (40.0, 4), 2: (0.0, 0)}, {1, 2}, now=41) == "" and b.trial.startswith("1 -> 2")
    per = 10 * slowdown
    b.observe({1: (40.0 + per, 5), 2: (per, 1)}, {1, 2}, now=41 + per)
    verdict = b.observe({1: (40.0 + 3 * per, 7), 2: (3 * per, 3)}, {1, 2}, now=41 + 3 * per)
    assert b.ceiling == ceiling and b.trial == ""
    assert verdict.startswith("no gain" if ceiling else "gain") and "0.100 ->" in verdict
    b.observe({}, {1, 2}, now=41 + 3 * per + 300)  # a verdict stands for benefit_retry_s
    assert b.ceiling is None


def test_a_family_above_its_ceiling_gives_the_worker_back_when_another_family_has_work():
    at_ceiling = replace(VIEW, workers=2, ceiling=1, verdict="no gain from 1 -> 2 worker(s)")
    for workers in (1, 2):  # at it, or above it with nothing else waiting: no more
        held = decide(replace(at_ceiling, workers=workers), POLICY, 60)
        assert held.action == "hold" and held.reason.startswith("no gain") and "not past 1 worker(s)" in held.reason
    retired = decide(replace(at_ceiling, others_waiting=3), POLICY, 60)
    assert retired.action == "down" and "3 task(s) wait for the GPU's other families" in retired.reason
    assert decide(replace(at_ceiling, others_waiting=3), POLICY, 5).action == "hold"  # the cooldown holds it
    measuring = replace(VIEW, trial="1 -> 2 worker(s)")
    assert "measuring" in decide(measuring, POLICY, 60).reason
    # a family growing on the work upstream of it (its own queue empty) is not held for a trial that work cannot end
    assert decide(replace(measuring, backlog=0, upstream=30, service_s=10.0), POLICY, 60).action == "up"


# The autoscaler's tick in this process: sleeping stand-in workers, their registry entries and the ledger by hand.
CHAIN = "stages:\n  hands:\n    python: %s\n"


class Cluster:
    """One fake GPU of 20 GB with the autoscaler's service over it (through NvmlProbe and FakeNvml); each worker's
    tasks take ``per_task_s(workers of its family)`` seconds, each worker asks ``compute_pct`` of the GPU."""

    def __init__(self, r: redis.Redis, tmp: Path, policy: AutoscalePolicy, per_task_s, compute_pct: float) -> None:
        from tasks import configure
        from tasks.autoscaler.service import Autoscaler

        (tmp / "chain.yaml").write_text(CHAIN % sys.executable)
        conf = load_settings(tmp / "chain.yaml")
        configure(conf)
        self.r, self.now, self.per_task_s, self.compute_pct = r, 0.0, per_task_s, compute_pct
        self.ledger = FakeGpuLedger.create(tmp / "gpu.json", [{"total_mib": 20_000, "name": "Fake GPU 20GB"}])
        self.sup = Supervisor(
            lambda gpu, name: ["sleep", "300"], lambda gpu: dict(os.environ), None, 5, clock=lambda: self.now
        )
        self.scaler = Autoscaler(
            conf, policy, NvmlProbe(FakeNvml(self.ledger)), self.sup, clock=lambda: self.now,
            wall=lambda: 1_800_000_000 + self.now,
        )  # fmt: skip
        # pid -> [busy s, tasks ended, progress into the next, busy s as the last ended]
        self.work: dict[int, list[float]] = {}
        self.loaded: set[int] = set()

    def tick(self, seconds: float = 2.0) -> dict[str, str]:
        """Run gpu0's workers ``seconds`` (hands' stay idle), publish them, tick; return each family's decision
        ("action: reason")."""
        self.now += seconds
        for queue in ("gpu0", "gpu0.hands"):
            slots = [s for s in self.sup.active(0, queue) if s.pid is not None]
            for slot in slots:
                busy, done, into, ended = self.work.setdefault(slot.pid, [0.0, 0, 0.0, 0.0])
                if slot.pid in self.loaded and queue == "gpu0":  # registered: it works through the backlog
                    per_s = 1.0 / self.per_task_s(len(slots))
                    into, busy = into + seconds * per_s, busy + seconds
                    while into >= 1:
                        into, done = into - 1, done + 1
                        ended = busy - into / per_s  # a worker publishes its busy seconds as each task ends
                self.work[slot.pid] = [busy, done, into, ended]
                publish(self.r, {"hostname": f"{slot.name}@test", "pid": slot.pid, "gpu": 0, "gpu_queues": [queue],
                                 "busy": queue == "gpu0", "tasks_done": done, "busy_s": ended,
                                 "gpu_peak_mib": 2000.0}, ttl_s=60)  # fmt: skip
                if slot.pid not in self.loaded:
                    self.ledger.allocate(0, 2000, pid=slot.pid)
                    self.ledger.set_computing(0, self.compute_pct if queue == "gpu0" else 0, pid=slot.pid)
                    self.loaded.add(slot.pid)
        return {d.readings["queue"]: f"{d.action}: {d.reason}" for d in self.scaler.tick()}

    def workers(self, queue: str = "gpu0") -> int:
        return len(self.sup.active(0, queue))

    def close(self) -> None:
        self.sup.stop_all(grace_s=5)
        self.scaler.shutdown()


@pytest.fixture
def cluster_of(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    monkeypatch.setenv("REDIS_URL", redis_url)
    made: list[Cluster] = []

    def make(per_task_s, compute_pct: float = 30.0, **policy: float) -> Cluster:
        c = Cluster(redis.Redis.from_url(redis_url), tmp_path, replace(POLICY, quick_load_s=0, **policy),
                    per_task_s, compute_pct)  # fmt: skip
        made.append(c)
        c.r.rpush("gpu0", *["waiting"] * 40)
        return c

    yield make
    for c in made:
        c.close()


@pytest.mark.timeout(120)
def test_on_a_busy_gpu_the_autoscaler_keeps_one_worker_and_grows_once_it_has_compute_to_spare(cluster_of):
    """Each worker asks all of the GPU's time (NVML reads 100 %): memory fits eight, one works."""
    c = cluster_of(lambda n: 10.0 * n, compute_pct=100.0)
    said = [c.tick() for _ in range(30)]
    assert c.workers() == 1, said[-1]
    assert "100 % busy" in said[-1]["gpu0"] and "another worker adds no compute" in said[-1]["gpu0"]
    c.ledger.set_computing(0, 20, pid=c.sup.active(0, "gpu0")[0].pid)  # its model now leaves the GPU 80 % idle
    [c.tick() for _ in range(10)]
    assert c.workers() > 1


@pytest.mark.timeout(120)
def test_a_family_whose_second_worker_raised_no_throughput_is_not_grown_and_gives_it_back(cluster_of):
    """The GPU reads 30 % busy per worker but the family's tasks take n x 10 s with n workers (its tasks per second
    stay flat): one more worker is tried, measured, not followed by another, and given back once hands has work."""
    c = cluster_of(lambda n: 10.0 * n, max_starting_per_gpu=1, busy_pct=101)
    most = 0
    for _ in range(80):
        said = c.tick()
        most = max(most, c.workers())
    assert most == 2 and c.workers() == 2, said
    assert said["gpu0"].startswith("hold: no gain from 1 -> 2 worker(s)") and "not past 1" in said["gpu0"], said
    c.r.rpush("gpu0.hands", *["waiting"] * 5)
    said = [c.tick() for _ in range(10)]
    assert c.workers() == 1, said
    down = next(s["gpu0"] for s in said if s["gpu0"].startswith("down"))
    assert "above the 1 that gave the same" in down and "wait for the GPU's other families" in down


@pytest.mark.timeout(120)
def test_a_family_whose_workers_raise_its_throughput_grows_to_its_backlog(cluster_of):
    """The control: tasks take 10 s whatever the count; every trial gains, the family keeps growing."""
    c = cluster_of(lambda n: 10.0, max_starting_per_gpu=1, busy_pct=101)
    for _ in range(200):
        said = c.tick()
        if c.workers() == 8:
            break
    assert c.workers() == 8, said
    assert c.scaler.benefit["gpu0"].verdict.startswith("gain from 6 -> 7 worker(s)")

"""Two GPU hosts in network namespaces against one Redis: a normal run, a host killed, a host cut off and back,
a host whose clock is off. Host A has two fake GPUs, host B one; each runs the autoscaler and a CPU worker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tasks.gpu import FakeGpuLedger
from tasks.outputs.storage import read_marker
from tasks.run import runs
from tests.conftest import PIPELINE_ENV, ROOT, run_script, skip_unless_ci, wait_until
from tests.faults.conftest import assert_nothing_lost, record
from tests.faults.hosts import Cluster, Host, why_no_namespaces

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
NO_NAMESPACES = why_no_namespaces()

LEASE_TTL_S = 6.0
# A GPU stage of a 16-frame video takes a few seconds here, so a fault lands while B holds one.
SETTINGS = f"""
lease_ttl_s: {LEASE_TTL_S}
heartbeat_interval_s: 0.5
registry_ttl_s: 3
stages:
  depth: {{params: {{matmuls_per_frame: 100}}}}
  tracks: {{params: {{matmuls_per_frame: 50}}}}
"""
GPUS = {"hostA": 2, "hostB": 1}
STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/\w+\] "
REQUEUED = re.compile(STAMP + r"requeued message ([0-9a-f-]+)[ :]")
RECEIVED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/\w+\] Task (framefleet\.\w+)\[([0-9a-f-]+)\] "
    r"received"
)


@pytest.fixture(autouse=True)
def _namespaces() -> None:
    if NO_NAMESPACES:
        skip_unless_ci(f"needs root for network namespaces: {NO_NAMESPACES}")


class TwoHosts:
    """The cluster of one test: Redis in the root namespace, hostA and hostB, the shared output folder."""

    def __init__(self, tmp: Path, skew_b_s: float = 0.0) -> None:
        self.tmp = tmp
        self.cluster = Cluster(tmp)
        self.a = self.cluster.add_host("hostA")
        self.b = self.cluster.add_host("hostB", skew_s=skew_b_s)
        self.cluster.start_redis()
        (tmp / "settings.yaml").write_text(SETTINGS)
        self.out = tmp / "out"

    def env(self, host: Host | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in PIPELINE_ENV}
        env.update(
            REDIS_URL=self.cluster.url(host),
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            FRAMEFLEET_CONFIG=str(self.tmp / "settings.yaml"),
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
        )
        return env

    def logs(self, host: Host) -> Path:
        return self.tmp / "logs" / host.name

    def start(self) -> None:
        for host in (self.a, self.b):
            ledger = self.tmp / host.name / "ledger.json"
            ledger.parent.mkdir(parents=True)
            FakeGpuLedger.create(ledger, [{"total_mib": 8192, "name": f"Fake GPU of {host.name}"}] * GPUS[host.name])
            host.start(
                [
                    sys.executable,
                    "scripts/autoscaler.py",
                    "--fake-gpu",
                    str(ledger),
                    "--log-dir",
                    str(self.logs(host)),
                    "--tick-s",
                    "0.5",
                    "--max-workers-per-gpu",
                    "1",
                    "--stop-grace-s",
                    "20",
                ],
                self.env(host),
                self.logs(host) / "autoscaler.log",
            )
            host.start(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tasks",
                    "worker",
                    "-Q",
                    "cpu",
                    "-P",
                    "prefork",
                    "-c",
                    "1",
                    "-n",
                    "cpu@%h",
                    "-E",
                    "--without-gossip",
                    "--without-mingle",
                    "--loglevel",
                    "INFO",
                ],
                self.env(host),
                self.logs(host) / "cpu.log",
            )
        expected = {"gpu0-1@hostA", "gpu1-1@hostA", "cpu@hostA", "gpu0-1@hostB", "cpu@hostB"}
        wait_until(lambda: expected <= self.workers(), 120, f"the workers {sorted(expected)} to register")

    def workers(self) -> set[str]:
        return {key.removeprefix("ff:worker:") for key in self.cluster.client().scan_iter("ff:worker:*")}

    def state(self, name: str) -> dict:
        raw = self.cluster.client().get(f"ff:worker:{name}")
        return json.loads(raw) if raw else {}

    def enqueue(self, raw: Path, wait: bool = False) -> subprocess.CompletedProcess:
        """Enqueue from the third host (the root namespace)."""
        args = [str(raw), "--out", str(self.out)] + ([] if wait else ["--no-wait"])
        done = run_script("enqueue_dataset.py", *args, env=self.env(None), timeout_s=400)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def held_by(self, host: Host) -> dict[str, str]:
        """Task id -> delivery tag of every unacknowledged message whose lease a worker of ``host`` holds now."""
        r = self.cluster.client()
        held = {}
        for key in r.scan_iter("ff:lease:*"):
            value = r.get(key) or ""
            # A lease outlives its message's ack by up to the TTL: count only unacknowledged messages.
            if value.split(" ")[0].endswith("@" + host.name) and r.hexists("unacked", key.removeprefix("ff:lease:")):
                held[value.split(" ")[1]] = key.removeprefix("ff:lease:")
        return held

    def received(self, host: Host) -> dict[str, float]:
        """Task id -> wall time at which a worker of ``host`` first received it, from its logs."""
        return self._first(host, RECEIVED, 3)

    def requeued(self, host: Host) -> dict[str, float]:
        """Delivery tag -> wall time at which a reaper on ``host`` put its message back on a queue."""
        return self._first(host, REQUEUED, 2)

    def _first(self, host: Host, pattern: re.Pattern[str], group: int) -> dict[str, float]:
        seen: dict[str, float] = {}
        for log in self.logs(host).glob("*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if m := pattern.match(line):
                    at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    seen[m[group]] = min(at, seen.get(m[group], at))
        return seen

    def failover(self, held: dict[str, str], lost_at: float) -> tuple[float, float]:
        """Seconds from ``lost_at`` until the last of ``held`` was back on a queue, and until it started on hostA.

        Fails the test if one of them never came back or never ran on hostA.
        """
        requeued, started = self.requeued(self.a), self.received(self.a)
        missing = {task for task, tag in held.items() if tag not in requeued or task not in started}
        assert not missing, f"hostB's tasks {missing} were not requeued and run on hostA"
        return (max(requeued[tag] for tag in held.values()) - lost_at, max(started[task] for task in held) - lost_at)

    def stage_runs(self) -> Counter[tuple[str, str]]:
        """How many times each (stage, video) ran to its output, over both hosts' worker logs."""
        runs: Counter[tuple[str, str]] = Counter()
        for log in (self.tmp / "logs").glob("*/*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if "] ran " in line:
                    stage, _, vid = line.partition("] ran ")[2].partition(" of ")
                    runs[(stage, vid.strip())] += 1
        return runs

    def ran_where(self, runs: Counter[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        """For each (stage, video) of ``runs`` that ran more than once: the log lines that say so, with their worker."""
        twice = {k for k, n in runs.items() if n > 1}
        found: dict[tuple[str, str], list[str]] = {k: [] for k in twice}
        for log in (self.tmp / "logs").glob("*/*.log"):
            for line in log.read_text(errors="replace").splitlines():
                stage, _, vid = line.partition("] ran ")[2].partition(" of ")
                if (stage, vid.strip()) in twice:
                    found[(stage, vid.strip())].append(f"{log.parent.name}/{log.name}: {line}")
        return found

    def ran_on(self) -> Counter[str]:
        """GPU stage runs per GPU worker (host and GPU), from the logs."""
        counts: Counter[str] = Counter()
        for log in (self.tmp / "logs").glob("*/gpu*.log"):
            text = log.read_text(errors="replace")
            counts[f"{log.stem}@{log.parent.name}"] = sum(
                text.count(f"] ran {s} of ") for s in ("depth", "tracks", "hands")
            )
        return counts

    def finished_run(self, held: dict[str, str], timeout_s: float = 400) -> dict:
        """The run's summary once written (a video whose chain stopped never lets it be: the test then fails)."""

        def summary() -> dict | None:
            if not (self.out / "run_summary.json").exists():
                return None
            found = json.loads((self.out / "run_summary.json").read_text())
            return found if runs.ended(self.out, found["run_id"]) else None

        return wait_until(summary, timeout_s, f"the run summary (hostB held {sorted(held)})", poll_s=0.5)

    def close(self) -> None:
        self.cluster.close()


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[TwoHosts]:
    cluster = TwoHosts(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def assert_markers_match_outputs(out: Path) -> int:
    """Every completion marker names a whole file with its hash; no stray or temporary file. Returns markers."""
    markers = list(out.glob("work/*/*.done.json")) + list(out.glob("markers/*/*.hdf5.done.json"))
    for marker in markers:
        if marker.parent.parent.name == "markers":  # the dataset file's marker outlives OUT/work/ (in a shard)
            output = out / marker.name.removesuffix(".done.json")
        else:
            output = marker.with_name(marker.name.removesuffix(".done.json") + ".npz")
        assert read_marker(output, marker) is not None, f"{marker} does not match {output}"
    names = {p.name for p in out.glob("work/*/*")}
    allowed = {f"{s}{ext}" for s in ("preprocess", "depth", "tracks", "hands") for ext in (".npz", ".done.json")}
    assert names <= allowed | {"h5.done.json"}, names - allowed
    assert [p.name for p in out.rglob("*.tmp")] == []
    return len(markers)


def test_a_dataset_from_a_third_host_runs_on_both_hosts_and_all_three_gpus(two_hosts, video_factory):
    raw = video_factory(6)
    status = run_script("status.py", env=two_hosts.env(None))
    assert status.returncode == 0, status.stderr
    hosts = {line.split()[0]: line.split()[1:3] for line in status.stdout.splitlines() if line.startswith("host")}
    assert hosts == {"hostA": ["gpu0,gpu1", "3"], "hostB": ["gpu0", "2"]}, status.stdout
    done = two_hosts.enqueue(raw, wait=True)
    assert "6 done" in done.stdout or json.loads((two_hosts.out / "run_summary.json").read_text())["done"] == 6
    assert_nothing_lost(two_hosts.out)
    assert assert_markers_match_outputs(two_hosts.out) == 6 * 5
    runs = two_hosts.stage_runs()
    assert len(runs) == 6 * 5 and set(runs.values()) == {1}, two_hosts.ran_where(runs) or runs
    spread = two_hosts.ran_on()
    assert {k for k, v in spread.items() if v} == {"gpu0-1@hostA", "gpu1-1@hostA", "gpu0-1@hostB"}, spread
    record("two hosts, normal run", f"6 videos; GPU stage runs {dict(spread)}", two_hosts.out, None, None)


def busy_on_gpu(cluster: TwoHosts, name: str) -> dict | None:
    state = cluster.state(name)
    task = (state.get("current") or {}).get("task") or ""
    return state if state.get("busy") and task.rsplit(".", 1)[-1] in ("depth", "tracks", "hands") else None


@pytest.mark.ci_fault
def test_host_b_killed_mid_run_its_tasks_finish_on_host_a(two_hosts, fault_raw):
    two_hosts.enqueue(fault_raw)
    wait_until(lambda: busy_on_gpu(two_hosts, "gpu0-1@hostB"), 180, "hostB's GPU worker busy on a GPU stage")
    killed = two_hosts.b.kill_everything()
    killed_at = time.time()
    # Read after the kill: a message acknowledged just before it is not hostB's to lose.
    held = two_hosts.held_by(two_hosts.b)
    assert held, "hostB held no message when it was killed busy"
    summary = two_hosts.finished_run(held)
    assert summary["done"] == 4 and summary["failed"] == []
    requeued_s, started_s = two_hosts.failover(held, killed_at)
    assert requeued_s <= LEASE_TTL_S + 10, f"hostB's tasks were back on a queue only after {requeued_s:.1f} s"
    assert_nothing_lost(two_hosts.out)
    assert_markers_match_outputs(two_hosts.out)
    runs = two_hosts.stage_runs()
    assert len(runs) == 4 * 5 and set(runs.values()) == {1}, two_hosts.ran_where(runs) or runs
    record(
        "two hosts: hostB SIGKILLed",
        f"{killed} processes killed holding {len(held)} task(s); started on "
        f"hostA after {started_s:.1f} s; {sum(runs.values())} stage runs, max {max(runs.values())} per stage",
        two_hosts.out,
        None,
        requeued_s,
    )


@pytest.mark.ci_fault
def test_host_b_cut_off_mid_run_then_back_writes_no_second_copy(two_hosts, fault_raw):
    two_hosts.enqueue(fault_raw)
    busy = wait_until(lambda: busy_on_gpu(two_hosts, "gpu0-1@hostB"), 180, "hostB's GPU worker busy on a GPU stage")
    two_hosts.b.cut()
    cut_at = time.time()
    held = two_hosts.held_by(two_hosts.b)  # once cut off, hostB can acknowledge nothing more
    assert held, "hostB held no message when it was cut off busy"
    summary = two_hosts.finished_run(held)
    assert summary["done"] == 4 and summary["failed"] == []
    requeued_s, started_s = two_hosts.failover(held, cut_at)
    assert requeued_s <= LEASE_TTL_S + 10, f"hostB's tasks were back on a queue only after {requeued_s:.1f} s"
    # hostB comes back: its workers register again, and whatever it still had in hand ends.
    two_hosts.b.reconnect()
    wait_until(lambda: {"gpu0-1@hostB", "cpu@hostB"} <= two_hosts.workers(), 120, "hostB's workers to come back")
    wait_until(lambda: not busy_on_gpu(two_hosts, "gpu0-1@hostB"), 120, "hostB to finish what it had in hand")
    assert_nothing_lost(two_hosts.out)
    assert_markers_match_outputs(two_hosts.out)
    runs = two_hosts.stage_runs()
    video = busy["current"]["video"]
    assert len(runs) == 4 * 5 and set(runs.values()) == {1}, two_hosts.ran_where(runs) or (len(runs), video)
    assert json.loads((two_hosts.out / "run_summary.json").read_text())["done"] == 4
    record(
        "two hosts: hostB cut off, then back",
        f"link down with {len(held)} task(s) in hand; started on hostA "
        f"after {started_s:.1f} s; {sum(runs.values())} stage runs, max {max(runs.values())} per stage",
        two_hosts.out,
        None,
        requeued_s,
    )


@pytest.mark.parametrize("skew_s", [-20.0, 20.0])
def test_host_b_with_its_clock_off_by_more_than_the_lease_ttl(tmp_path, fault_raw, skew_s):
    cluster = TwoHosts(tmp_path, skew_b_s=skew_s)
    try:
        cluster.start()
        reported = cluster.state("gpu0-1@hostB")["updated"]
        assert abs(reported - time.time() - skew_s) < 5, "hostB's clock is not skewed"
        cluster.enqueue(fault_raw)
        wait_until(lambda: busy_on_gpu(cluster, "gpu0-1@hostB"), 180, "hostB's GPU worker busy on a GPU stage")
        cluster.b.kill_everything()
        killed_at = time.time()
        held = cluster.held_by(cluster.b)
        assert held, "hostB held no message when it was killed busy"
        summary = cluster.finished_run(held)
        assert summary["done"] == 4 and summary["failed"] == []
        requeued_s, started_s = cluster.failover(held, killed_at)
        assert requeued_s <= LEASE_TTL_S + 10, f"hostB's tasks were back on a queue only after {requeued_s:.1f} s"
        assert_nothing_lost(cluster.out)
        assert_markers_match_outputs(cluster.out)
        runs = cluster.stage_runs()  # while both ran, neither host's reaper took a live task of the other
        assert len(runs) == 4 * 5 and set(runs.values()) == {1}, cluster.ran_where(runs) or runs
        record(
            f"two hosts: hostB's clock {skew_s:+.0f} s, then SIGKILLed",
            f"lease TTL {LEASE_TTL_S:.0f} s; started "
            f"on hostA after {started_s:.1f} s; {sum(runs.values())} stage runs, max {max(runs.values())} per stage",
            cluster.out,
            None,
            requeued_s,
        )
    finally:
        cluster.close()

"""The shipped sbatch scripts under a real Slurm (tests/faults/slurm.py): a dataset to the end, and Slurm's everyday
events (time limit, scancel, preemption with requeue, a drained node, an array wider than the node) lose nothing and
run nothing twice. Each scenario's measured times go to $FRAMEFLEET_FAULT_REPORT (docs/slurm.md has them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import redis

from tasks.delivery import queues
from tasks.gpu import FakeGpuLedger
from tasks.workers import registry
from tests.conftest import ROOT, skip_unless_ci, wait_until
from tests.faults.conftest import assert_nothing_lost, env_for, record, twice, wait_for_summary
from tests.faults.slurm import KILL_WAIT_S, NODE, SlurmCluster

GPU_SBATCH = ROOT / "deploy" / "slurm" / "framefleet-gpu.sbatch"
CPU_SBATCH = ROOT / "deploy" / "slurm" / "framefleet-cpu.sbatch"
# A depth task of 24 to 48 s (1.6 s clips at 15 to 30 fps), waited rather than computed: longer than Slurm's
# KillWait, so a plain scancel kills it in hand, and as long on a loaded machine as on an idle one.
SLOW = "stages:\n  depth:\n    params: {seconds_per_frame: 1.0}\n"
# The node has 4 CPUs; a GPU job of this test takes one (its script asks for 8, as a real GPU node has).
ONE_CPU = "--cpus-per-task=1"


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(c) is None]
    if missing:
        skip_unless_ci(f"Slurm is not installed ({', '.join(missing)}): `make need-slurm`")
    if os.geteuid() != 0:
        skip_unless_ci("a private Slurm runs its daemons as root and makes its GPU device files with mknod")
    folder = tmp_path / "slurm"
    folder.mkdir()
    cluster = SlurmCluster(folder, cpus=4)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


class Deployment:
    """framefleet's jobs on ``slurm`` against one Redis: what a user submits and what they see of it."""

    def __init__(self, slurm: SlurmCluster, redis_url: str, tmp_path: Path, settings: str = "") -> None:
        self.slurm = slurm
        self.jobs = tmp_path / "jobs"  # sbatch's working folder: the jobs' logs land here
        self.jobs.mkdir()
        ledger = tmp_path / "fake-gpus.json"
        FakeGpuLedger.create(ledger, [{"total_mib": 24576}, {"total_mib": 24576}])
        env_file = tmp_path / "framefleet.env"  # the deployment's /etc/framefleet/env
        env_file.write_text(f"REDIS_URL={redis_url}\n")
        extra = {"FRAMEFLEET_CONFIG": str(tmp_path / "settings.yaml")} if settings else {}
        if settings:
            (tmp_path / "settings.yaml").write_text(settings)
        self.env = env_for(
            redis_url,
            FRAMEFLEET_HOME=str(ROOT),
            FRAMEFLEET_ENV_FILE=str(env_file),
            FRAMEFLEET_FAKE_GPU=str(ledger),
            FRAMEFLEET_POLL_S="0.5",
            FRAMEFLEET_DRAIN_POLL_S="1",
            **extra,
        )
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)

    def submit(self, script: Path, *options: str) -> str:
        return self.slurm.sbatch(*options, str(script), env=self.env, cwd=self.jobs)

    def gpu_job(self, *options: str) -> str:
        return self.submit(GPU_SBATCH, "--gres=gpu:2", ONE_CPU, *options)

    def workers(self, job: str) -> list[dict]:
        """The live workers of ``job`` (their names carry its id)."""
        return [w for w in registry.live_workers(self.r) if f".{job}@" in w["hostname"]]

    def wait_for_workers(self, job: str, n: int, timeout_s: float = 180) -> None:
        wait_until(lambda: len(self.workers(job)) >= n, timeout_s, f"{n} worker(s) of job {job}; {self.log(job)}")

    def busy_on_depth(self, job: str, timeout_s: float = 180) -> dict:
        """The first worker of ``job`` that has just started a depth task (its state's ``current``)."""

        def found() -> dict | None:
            for w in self.workers(job):
                current = w.get("current") or {}
                if w.get("busy") and current.get("task") == "framefleet.depth":
                    return current
            return None

        return wait_until(found, timeout_s, f"a worker of job {job} busy on depth")  # type: ignore[return-value]

    def enqueue(self, raw: Path, out: Path) -> None:
        """`framefleet enqueue` from the login side."""
        done = subprocess.run(
            [sys.executable, "-m", "tasks.cli.main", "enqueue", str(raw), "--out", str(out), "--no-wait"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def wait_for_end(self, job: str, timeout_s: float = 240) -> str:
        ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY")
        state = wait_until(lambda: (s := self.slurm.state(job)) in ended and s, timeout_s, f"job {job} to end")
        return str(state)

    def gpu_in_hand(self) -> int:
        """GPU task messages delivered and not yet acknowledged (kombu's ``unacked``: [message, exchange, key])."""
        return sum(1 for raw in self.r.hvals("unacked") if json.loads(raw)[2].startswith("gpu"))

    def gpu_waiting(self) -> int:
        return sum(queues.length(self.r, q) for q in ("gpu0", "gpu1"))

    def log(self, job: str) -> str:
        logs = list(self.jobs.glob(f"*-{job}*.log"))
        return "\n".join(p.read_text(errors="replace") for p in logs)


STOP = re.compile(r"framefleet: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d): (.*): warm shutdown")
START = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+: INFO/MainProcess\] start (\S+ of \S+)")


def started_after_stop(log: str) -> list[str]:
    """The tasks a job's workers started more than 1 s after its script told them to stop (its log, both clocks
    the node's; the second covers the signal's way and the stamps' resolution). Fails when nothing stopped."""
    stop = STOP.search(log)
    assert stop, f"the job's script never told its workers to stop:\n{log}"
    told = datetime.fromisoformat(stop.group(1)) + timedelta(seconds=1)
    return [m.group(2) for m in START.finditer(log) if datetime.fromisoformat(m.group(1)) > told]


@pytest.mark.ci_fault
@pytest.mark.timeout(600)
def test_a_gpu_job_and_a_cpu_job_serve_a_dataset_to_the_end(slurm, fault_raw, redis_server, reference_stats, tmp_path):
    deploy = Deployment(slurm, redis_server.url, tmp_path)
    gpu = deploy.gpu_job()
    cpu = deploy.submit(CPU_SBATCH)
    deploy.wait_for_workers(gpu, 2)
    deploy.wait_for_workers(cpu, 1)
    # Slurm gave the job its two GPUs through CUDA_VISIBLE_DEVICES; one worker per GPU, named for the job.
    assert "2 GPU(s) (CUDA_VISIBLE_DEVICES=0,1)" in deploy.log(gpu)
    named = {w["hostname"].split("@")[0]: w["gpu_queues"] for w in deploy.workers(gpu)}
    assert named == {f"gpu0.{gpu}": ["gpu0"], f"gpu1.{gpu}": ["gpu1"]}
    out = tmp_path / "out"
    started = time.time()
    deploy.enqueue(fault_raw, out)
    summary = wait_for_summary(out)
    assert summary["done"] == 4 and summary["failed"] == []
    assert_nothing_lost(out, reference_stats)
    assert not twice(deploy.jobs)
    assert all(w["tasks_done"] > 0 for w in deploy.workers(gpu))  # both GPUs served the run
    slurm.run("scancel", "--batch", "--signal=TERM", gpu, cpu)
    for job in (gpu, cpu):
        assert deploy.wait_for_end(job) == "COMPLETED", deploy.log(job)
        assert "all workers stopped" in deploy.log(job)
    record("Slurm: GPU job + CPU job", "none", out, reference_stats, summary["finished"] - started, deploy.jobs)


def start_slow_run(deploy: Deployment, raw: Path, out: Path) -> tuple[str, str, dict]:
    """A GPU job and a CPU job serving a run of slow depth; (gpu job, cpu job, the depth task just started)."""
    gpu = deploy.gpu_job()
    cpu = deploy.submit(CPU_SBATCH)
    deploy.wait_for_workers(gpu, 2)
    deploy.wait_for_workers(cpu, 1)
    deploy.enqueue(raw, out)
    return gpu, cpu, deploy.busy_on_depth(gpu)


def finish(deploy: Deployment, out: Path, reference: dict, scenario: str, fault: str, since: float) -> dict:
    """A fresh GPU job finishes the run: every video once, nothing run twice, statistics as without a fault."""
    again = deploy.gpu_job()
    summary = wait_for_summary(out, timeout_s=400)
    assert summary["done"] == 4 and summary["failed"] == [], summary
    assert_nothing_lost(out, reference)
    assert not twice(deploy.jobs)
    record(scenario, fault, out, reference, summary["finished"] - since, deploy.jobs)
    deploy.slurm.run("scancel", again)
    return summary


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", ["plain", "batch-term"])
def test_scancel(how, slurm, fault_raw, redis_server, reference_stats, tmp_path):
    """Plain scancel: SIGTERM to every process of the job, SIGKILL after KillWait, so a task longer than that is
    killed in hand and its lease hands it on. ``--batch --signal=TERM``: only the script is told; the task in
    hand finishes however long it takes, then the job ends."""
    deploy = Deployment(slurm, redis_server.url, tmp_path, SLOW)
    out = tmp_path / "out"
    gpu, _, current = start_slow_run(deploy, fault_raw, out)
    video = current["video"]
    cancelled = time.time()
    if how == "plain":
        slurm.run("scancel", gpu)
    else:
        slurm.run("scancel", "--batch", "--signal=TERM", gpu)
    state = deploy.wait_for_end(gpu, timeout_s=120)
    ended = time.time()
    log = deploy.log(gpu)
    assert not started_after_stop(log)
    if how == "plain":
        assert state == "CANCELLED", log
        assert ended - cancelled < KILL_WAIT_S + 15, "Slurm's SIGKILL came after KillWait"
        assert f"ran depth of {video}" not in log  # killed in hand ...
        wait_until(lambda: deploy.gpu_in_hand() == 0 and deploy.gpu_waiting(), 60, "the killed task back on a queue")
        back = time.time()
        print(
            f"slurm-times scancel: job ended {ended - cancelled:.1f} s, task back on a queue {back - cancelled:.1f} s"
        )
    else:
        assert state == "COMPLETED" and "all workers stopped" in log, log
        assert f"ran depth of {video}" in log  # ... or finished in hand
        print(f"slurm-times scancel --batch --signal=TERM: job ended {ended - cancelled:.1f} s")
    finish(deploy, out, reference_stats, f"Slurm: scancel ({how})", f"scancel mid-depth ({how})", cancelled)


def finished_in_hand(log: str) -> list[str]:
    """The tasks a job's workers had started before its script told them to stop and finished after."""
    stop = STOP.search(log)
    assert stop
    before, after = log[: stop.start()], log[stop.start() :]
    return [m.group(2) for m in START.finditer(before) if f"ran {m.group(2)}" in after]


@pytest.mark.timeout(900)
def test_time_limit_stops_the_job_warm_before_slurms_kill(slurm, fault_raw, redis_server, reference_stats, tmp_path):
    deploy = Deployment(slurm, redis_server.url, tmp_path, SLOW)
    out = tmp_path / "out"
    limit_s, notice_s = 180, 120  # SIGTERM 120 s before the limit (Slurm sends it up to 30 s earlier still)
    submitted = time.time()
    gpu = deploy.gpu_job(f"--time={limit_s // 60}", f"--signal=B:TERM@{notice_s}")
    deploy.submit(CPU_SBATCH)
    deploy.wait_for_workers(gpu, 2)
    deploy.enqueue(fault_raw, out)
    wait_until(lambda: STOP.search(deploy.log(gpu)), limit_s, "Slurm's SIGTERM before the time limit")
    termed = time.time()
    state = deploy.wait_for_end(gpu, timeout_s=limit_s)
    ended = time.time()
    log = deploy.log(gpu)
    assert state == "COMPLETED" and "all workers stopped" in log, log  # not TIMEOUT: it ended before the limit
    assert ended - submitted < limit_s
    assert finished_in_hand(log), log  # the depth in hand when the notice came was finished
    assert not started_after_stop(log)
    print(f"slurm-times time limit: TERM {termed - submitted:.0f} s after submission, job ended {ended - termed:.1f} s")
    finish(deploy, out, reference_stats, "Slurm: time limit", f"--time={limit_s // 60} --signal=B:TERM@120", termed)


@pytest.mark.timeout(900)
def test_preemption_requeues_the_job_and_its_workers_pick_the_run_up(
    slurm, fault_raw, redis_server, reference_stats, tmp_path
):
    deploy = Deployment(slurm, redis_server.url, tmp_path, SLOW)
    out = tmp_path / "out"
    gpu, _, current = start_slow_run(deploy, fault_raw, out)
    preempted = time.time()
    # A job of the higher-priority partition wants both GPUs: Slurm requeues framefleet's (PreemptMode=REQUEUE).
    urgent = slurm.sbatch("-p", "urgent", "--gres=gpu:2", ONE_CPU, "--wrap", "sleep 5", cwd=deploy.jobs)
    wait_until(lambda: int(slurm.job(gpu).get("Restarts", 0)) >= 1, 120, f"job {gpu} to be requeued")
    requeued = time.time()
    wait_until(lambda: deploy.gpu_in_hand() == 0 and deploy.gpu_waiting(), 120, "the task in hand back on a queue")
    back = time.time()
    assert deploy.wait_for_end(urgent) == "COMPLETED"
    deploy.wait_for_workers(gpu, 2, timeout_s=400)  # the same job again, on its GPUs
    returned = time.time()
    summary = wait_for_summary(out, timeout_s=400)
    assert summary["done"] == 4 and summary["failed"] == [], summary
    assert_nothing_lost(out, reference_stats)
    assert not twice(deploy.jobs), deploy.log(gpu)
    assert deploy.log(gpu).count("framefleet: job") == 2  # one log, appended to by the job's second run
    begin = slurm.job(gpu)
    print(
        f"slurm-times preemption: requeued {requeued - preempted:.1f} s, task on a queue {back - preempted:.1f} s, "
        f"workers back {returned - preempted:.1f} s, run done {summary['finished'] - preempted:.1f} s; "
        f"requeued job: submit {begin.get('SubmitTime')}, eligible {begin.get('EligibleTime')}, "
        f"start {begin.get('StartTime')}"
    )
    record("Slurm: preemption", "requeued by a higher tier", out, reference_stats, returned - preempted, deploy.jobs)


@pytest.mark.timeout(900)
def test_a_drained_node_starts_no_new_task_and_finishes_those_running(
    slurm, fault_raw, redis_server, reference_stats, tmp_path
):
    deploy = Deployment(slurm, redis_server.url, tmp_path, SLOW)
    out = tmp_path / "out"
    gpu, cpu, current = start_slow_run(deploy, fault_raw, out)
    drained = time.time()
    slurm.run("scontrol", "update", f"nodename={NODE}", "state=drain", "reason=maintenance")
    for job in (gpu, cpu):
        assert deploy.wait_for_end(job, timeout_s=120) == "COMPLETED", deploy.log(job)
        assert "is draining: warm shutdown" in deploy.log(job)
        assert not started_after_stop(deploy.log(job))
    ended = time.time()
    assert f"ran depth of {current['video']}" in deploy.log(gpu)  # the task in hand finished there
    waiting = deploy.gpu_job()  # a drained node takes no new job either
    wait_until(lambda: "DRAIN" in slurm.node_state(), 30, "the node drained")
    assert slurm.state(waiting) == "PENDING"
    slurm.run("scancel", waiting)
    print(f"slurm-times drain: both jobs ended {ended - drained:.1f} s after the drain")
    slurm.run("scontrol", "update", f"nodename={NODE}", "state=resume")
    deploy.submit(CPU_SBATCH)
    finish(deploy, out, reference_stats, "Slurm: node drained", "scontrol update state=drain mid-depth", drained)


@pytest.mark.timeout(900)
def test_a_cpu_array_wider_than_the_node(slurm, fault_raw, redis_server, reference_stats, tmp_path):
    deploy = Deployment(slurm, redis_server.url, tmp_path)
    gpu = deploy.gpu_job()  # one of the node's 4 CPUs
    array = deploy.submit(CPU_SBATCH, "--array=0-5")  # 6 tasks of one CPU: 3 fit

    def states() -> list[str]:
        return slurm.run("squeue", "-h", "-r", "-j", array, "-o", "%T").split()

    wait_until(lambda: states().count("RUNNING") == 3, 120, "3 of the array's tasks running")
    assert sorted(states()) == ["PENDING"] * 3 + ["RUNNING"] * 3
    deploy.wait_for_workers(gpu, 2)
    cpu_workers = lambda: [w for w in registry.live_workers(deploy.r) if w["hostname"].startswith("cpu0.")]  # noqa: E731
    wait_until(lambda: len(cpu_workers()) == 3, 180, "a CPU worker of each running task")
    assert {w["hostname"].split("@")[0].rpartition("_")[0] for w in cpu_workers()} == {f"cpu0.{array}"}
    out = tmp_path / "out"
    started = time.time()
    deploy.enqueue(fault_raw, out)
    summary = wait_for_summary(out)
    assert summary["done"] == 4 and summary["failed"] == []
    assert_nothing_lost(out, reference_stats)
    assert not twice(deploy.jobs)
    assert states().count("RUNNING") == 3  # the rest still wait for a core
    slurm.run("scancel", array)
    wait_until(lambda: not states(), 120, "the array to end")
    record("Slurm: CPU array of 6 on 3 free cores", "none", out, reference_stats, summary["finished"] - started)

"""The shipped sbatch scripts under a real Slurm (tests/faults/slurm.py): a dataset to the end, and Slurm's everyday
events (time limit, scancel, preemption with requeue, a drained node, an array wider than the node) lose nothing and
run nothing twice. Each scenario's row goes to $FRAMEFLEET_FAULT_REPORT; its times are printed (`-s`) and are in
docs/slurm.md.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.workers import registry
from tests.conftest import skip_unless_ci, wait_until
from tests.faults.conftest import assert_nothing_lost, record, twice, wait_for_summary
from tests.faults.slurm import KILL_WAIT_S, NODE, SlurmCluster
from tests.faults.slurm_jobs import (
    CPU_SBATCH,
    ONE_CPU,
    STOP,
    Deployment,
    finish,
    finished_in_hand,
    start_slow_run,
    stopped_warm,
)

# A depth task of 24 to 48 s (1.6 s clips at 15 to 30 fps), waited rather than computed: longer than Slurm's
# KillWait, so a plain scancel kills it in hand, and as long on a loaded machine as on an idle one.
SLOW = "stages:\n  depth:\n    params: {seconds_per_frame: 1.0}\n"
# 48 to 96 s: 2 depth tasks a GPU keep both busy past the earliest time limit notice below.
SLOWER = "stages:\n  depth:\n    params: {seconds_per_frame: 2.0}\n"


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


# Every scenario runs a private Slurm for minutes: make test-faults runs them, make test-ci-faults the first.
pytestmark = pytest.mark.slow


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
    stopped_warm(log, 2)
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


@pytest.mark.timeout(900)
def test_time_limit_stops_the_job_warm_before_slurms_kill(slurm, fault_raw, redis_server, reference_stats, tmp_path):
    deploy = Deployment(slurm, redis_server.url, tmp_path, SLOWER)
    out = tmp_path / "out"
    limit_s, notice_s = 240, 120  # SIGTERM 120 s before the limit; Slurm may send it up to 60 s earlier still
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
    stopped_warm(log, 2)
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
        stopped_warm(deploy.log(job), 2)
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

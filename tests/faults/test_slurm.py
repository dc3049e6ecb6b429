"""The shipped sbatch scripts under a real Slurm (tests/faults/slurm.py): a dataset to the end, and Slurm's everyday
events (time limit, scancel, preemption with requeue, a drained node, an array wider than the node) lose nothing and
run nothing twice. Each scenario's measured times go to $FRAMEFLEET_FAULT_REPORT (docs/slurm.md has them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tasks.delivery import queues
from tasks.gpu import FakeGpuLedger
from tasks.workers import registry
from tests.conftest import ROOT, skip_unless_ci, wait_until
from tests.faults.conftest import assert_nothing_lost, env_for, record, twice, wait_for_summary
from tests.faults.slurm import SlurmCluster

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
        return self.slurm.sbatch(script, *options, env=self.env, cwd=self.jobs)

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


def after_shutdown(log: str) -> str:
    """What a job's log says after its workers were told to stop."""
    return log.split("warm shutdown", 1)[1] if "warm shutdown" in log else ""


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
    assert sorted(w["hostname"].split("@")[0] for w in deploy.workers(gpu)) == [f"gpu0.{gpu}", f"gpu1.{gpu}"]
    out = tmp_path / "out"
    started = time.time()
    deploy.enqueue(fault_raw, out)
    summary = wait_for_summary(out)
    assert summary["done"] == 4 and summary["failed"] == []
    assert_nothing_lost(out, reference_stats)
    assert not twice(deploy.jobs)
    slurm.run("scancel", "--batch", "--signal=TERM", gpu, cpu)
    for job in (gpu, cpu):
        assert deploy.wait_for_end(job) == "COMPLETED", deploy.log(job)
        assert "all workers stopped" in deploy.log(job)
    record("Slurm: GPU job + CPU job", "none", out, reference_stats, summary["finished"] - started, deploy.jobs)

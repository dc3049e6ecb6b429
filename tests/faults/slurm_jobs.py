"""framefleet's jobs on a private Slurm (tests/faults/slurm.py), as a user submits and watches them: the shipped
sbatch scripts, their logs, their workers in the registry, the GPU messages in hand and waiting."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import redis

from tasks.delivery import queues
from tasks.gpu import FakeGpuLedger
from tasks.workers import registry
from tests.conftest import ROOT, wait_until
from tests.faults.conftest import assert_nothing_lost, env_for, record, twice, wait_for_summary
from tests.faults.slurm import SlurmCluster

GPU_SBATCH = ROOT / "deploy" / "slurm" / "framefleet-gpu.sbatch"
CPU_SBATCH = ROOT / "deploy" / "slurm" / "framefleet-cpu.sbatch"
# The node has 4 CPUs; a GPU job of the tests takes one (its script asks for 8, as a real GPU node has).
ONE_CPU = "--cpus-per-task=1"


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
    """The tasks a job's workers started more than 1 s after its script told them to stop (its log; both clocks the
    node's). A worker may still start the one message its last broker poll returned (Celery checks for a shutdown
    between polls), or one it took before the signal reached it on a busy machine; fails when nothing stopped."""
    stop = STOP.search(log)
    assert stop, f"the job's script never told its workers to stop:\n{log}"
    told = datetime.fromisoformat(stop.group(1)) + timedelta(seconds=1)
    return [m.group(2) for m in START.finditer(log) if datetime.fromisoformat(m.group(1)) > told]


def stopped_warm(log: str, workers: int) -> None:
    """After the stop, each of ``workers`` started at most the one task described above, and finished it there."""
    late = started_after_stop(log)
    assert len(late) <= workers, late
    assert all(f"ran {task}" in log for task in late), late


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


def finished_in_hand(log: str) -> list[str]:
    """The tasks a job's workers had started before its script told them to stop and finished after."""
    stop = STOP.search(log)
    assert stop
    before, after = log[: stop.start()], log[stop.start() :]
    return [m.group(2) for m in START.finditer(before) if f"ran {m.group(2)}" in after]

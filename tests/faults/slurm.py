"""A real single-node Slurm of one test: munged, slurmctld and slurmd as plain processes in a temporary folder.

Debian's ``slurm-wlm`` and ``munge`` (``make need-slurm``), as root. Everything lives under the folder: the munge
key and socket, ``slurm.conf`` with ports of its own, the controller's state and the node's spool, and the node's
two GPUs, which ``gres.conf`` names: character devices made with mknod (clones of /dev/null), since slurmd
refuses a plain file as a GPU ("not a valid character or block device") and then sets no ``CUDA_VISIBLE_DEVICES``.
With them a job of ``--gres=gpu:2`` gets ``CUDA_VISIBLE_DEVICES=0,1`` from Slurm, as on a GPU node; what the devices
would hold (memory, NVML's readings) is the fake GPU ledger's (``FRAMEFLEET_FAKE_GPU``, tasks/gpu/fake.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

from tasks.redis_client import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
NODE = "ffnode"
# Seconds between the SIGTERM of `scancel` (or a requeue) and Slurm's SIGKILL.
KILL_WAIT_S = 15

SLURM_CONF = """\
ClusterName=framefleet
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={kill_wait}
MinJobAge=600
InactiveLimit=0
SlurmdTimeout=300
MessageTimeout=30
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:2 State=UNKNOWN
PartitionName=batch Nodes={node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes={node} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""


class SlurmError(RuntimeError):
    """A Slurm daemon or command failed; the message names it and where its log is."""


class SlurmCluster:
    """munged, slurmctld and slurmd of one test under ``folder``; ``env`` is what a login shell on it needs."""

    def __init__(self, folder: Path, cpus: int = 4) -> None:
        self.folder = folder
        self.cpus = cpus
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.gpu_files = [folder / f"gpu{i}" for i in range(2)]

    def start(self) -> None:
        """Write the configuration and start the three daemons; raise SlurmError if the node is not up in 60 s."""
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        for path in self.gpu_files:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(
            SLURM_CONF.format(
                host=host,
                folder=self.folder,
                ctld_port=free_port(),
                slurmd_port=free_port(),
                node=NODE,
                cpus=self.cpus,
                kill_wait=KILL_WAIT_S,
            )
        )
        (self.folder / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={self.folder}/gpu[0-1]\n")
        self._spawn(
            "munged",
            [
                "munged", "--foreground", "--force", f"--key-file={key}", f"--socket={self.folder}/munge.socket",
                f"--pid-file={self.folder}/munged.pid", f"--log-file={self.folder}/munged.log",
                f"--seed-file={self.folder}/munged.seed",
            ],
        )  # fmt: skip
        self._wait(lambda: (self.folder / "munge.socket").exists(), 20, "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._wait(lambda: self._answers(), 30, "slurmctld to answer")
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(lambda: self.node_state() in ("IDLE", "MIXED", "ALLOCATED"), 60, f"node {NODE} to be idle")

    def stop(self) -> None:
        """End the jobs' processes (SIGKILL: the test is over), then the daemons, each a process group of its own
        (SIGTERM, SIGKILL after 10 s)."""
        daemons = {proc.pid for proc in self.procs.values()}
        # A job's processes descend from slurmstepd, which slurmd starts in a session of its own: they are
        # found by the SLURM_CONF in their environment, which sbatch passed on to them.
        for pid in self.job_pids():
            if pid not in daemons:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for pid in self.job_pids():  # a slurmstepd that outlived slurmd
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def job_pids(self) -> list[int]:
        """Processes whose environment names this cluster's slurm.conf (the jobs' and their children)."""
        found = []
        needle = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
        return found

    def run(self, *argv: str, check: bool = True) -> str:
        """Run a Slurm client command (sbatch, scontrol ...) against this cluster; its stdout."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()} (logs: {self.folder})")
        return done.stdout

    def sbatch(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
        """``sbatch ARGS`` (options, then the script) as a user types it, from ``cwd`` with ``env``; the job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *args],
            env={**(env or os.environ), "SLURM_CONF": str(self.conf)},
            cwd=cwd or self.folder,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise SlurmError(f"sbatch {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` of ``job_id`` as a dict (JobState, Restarts, NodeList ...); {} once forgotten."""
        text = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "")

    def node_state(self) -> str:
        text = self.run("scontrol", "show", "node", "-o", NODE, check=False)
        match = re.search(r"State=(\S+)", text)
        return match.group(1) if match else ""

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _spawn(self, name: str, argv: list[str]) -> None:
        if shutil.which(argv[0]) is None:
            raise SlurmError(f"{argv[0]} is not installed: `make need-slurm` (apt-get install slurm-wlm munge)")
        self.procs[name] = subprocess.Popen(
            argv,
            env=self.env,
            stdout=open(self.folder / f"{name}.out", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _answers(self) -> bool:
        done = subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True, text=True, timeout=30)
        return "is UP" in done.stdout

    def _wait(self, condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmError(
                        f"{name} exited {proc.returncode} while waiting for {what}:\n"
                        f"{(self.folder / f'{name}.out').read_text(errors='replace')}\n{self.log(name)}"
                    )
            if condition():
                return
            time.sleep(0.2)
        raise SlurmError(f"timed out after {timeout_s} s waiting for {what}; logs in {self.folder}")

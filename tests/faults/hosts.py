"""Several hosts on one machine: network namespaces joined to Redis over veth pairs, each with its own host name.

The root namespace is the third host: it runs Redis (bound to loopback and to its end of each link) and
the enqueue script. Each GPU host is a network namespace whose only route is its link to Redis, and whose
processes run in a UTS namespace of their own, so ``socket.gethostname()`` (Celery's ``%h``) is the host's
name. Every host sees the same output folder: this machine's file system stands in for the shared storage.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.conftest import ROOT, wait_until

# A sitecustomize that shifts the wall clock of the Python processes of a host whose clock is off.
SKEWED_CLOCK = Path(__file__).resolve().parent / "skewed_clock"
# Runs in the host's new UTS namespace: take the host name, then become the command (no shell).
SET_HOSTNAME = "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")


def why_no_namespaces() -> str | None:
    """Why network namespaces cannot be made here (not root, no `ip`, no CAP_NET_ADMIN), or None."""
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "the two-host tests need `ip` (iproute2) and `unshare` (util-linux)"
    probe = f"ffprobe{os.getpid()}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return f"cannot make a network namespace (`ip netns add` needs CAP_NET_ADMIN): {result.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def _free_subnet() -> str:
    """A 10.x.y.0/24 that no interface of this machine uses, for this cluster's links alone."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=30).stdout
    rng = random.Random()
    for _ in range(100):
        prefix = f"10.{rng.randint(64, 127)}.{rng.randint(0, 255)}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 for the test links")


@dataclass
class Host:
    """One GPU host: a network namespace, its link to Redis, and the processes started in it."""

    name: str
    netns: str
    link: str  # the root namespace's end of the veth pair
    address: str  # this host's address
    redis_address: str  # Redis's address on this host's link
    skew_s: float = 0.0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host (its network, its host name, its clock); output to ``log``."""
        env = dict(env)
        if self.skew_s:
            env.update(
                PYTHONPATH=os.pathsep.join(filter(None, [str(SKEWED_CLOCK), env.get("PYTHONPATH")])),
                FRAMEFLEET_TEST_CLOCK_SKEW_S=str(self.skew_s),
            )
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.netns,
                    "unshare",
                    "--uts",
                    "--",
                    sys.executable,
                    "-c",
                    SET_HOSTNAME,
                    self.name,
                    *argv,
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        result = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, timeout=30)
        return [int(p) for p in result.stdout.split()]

    def kill_everything(self) -> int:
        """SIGKILL every process in this host's namespace, as a power cut would; return how many."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not self.pids(), 30, f"every process of {self.name} to end")
        for proc in self.procs:
            proc.wait(timeout=30)
        return len(pids)

    def cut(self) -> None:
        """Take this host's link down: it keeps running but reaches nothing."""
        _ip("link", "set", self.link, "down")

    def reconnect(self) -> None:
        _ip("link", "set", self.link, "up")

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM this host's processes (warm shutdown), then SIGKILL what is left."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


class Cluster:
    """Redis in the root namespace and GPU hosts in network namespaces; ``close`` removes all of it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.token = f"{os.getpid() % 100000}{secrets.token_hex(1)}"
        self.subnet = _free_subnet()
        self.password = secrets.token_hex(12)
        self.hosts: dict[str, Host] = {}
        self.redis: subprocess.Popen[bytes] | None = None
        self.port = 0

    def add_host(self, name: str, skew_s: float = 0.0) -> Host:
        index = len(self.hosts)
        netns, link = f"{name}-{self.token}", f"ff{index}{self.token}"
        root_ip, host_ip = f"{self.subnet}.{4 * index + 1}", f"{self.subnet}.{4 * index + 2}"
        _ip("netns", "add", netns)
        host = Host(name, netns, link, host_ip, root_ip, skew_s)
        self.hosts[name] = host  # from here on, close() removes it
        _ip("link", "add", link, "type", "veth", "peer", "name", f"{link}p")
        _ip("link", "set", f"{link}p", "netns", netns)
        _ip("-n", netns, "link", "set", f"{link}p", "name", "eth0")
        _ip("-n", netns, "addr", "add", f"{host_ip}/30", "dev", "eth0")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("addr", "add", f"{root_ip}/30", "dev", link)
        _ip("link", "set", link, "up")
        return host

    def start_redis(self) -> None:
        """Start redis-server on loopback and on the root end of every host's link, with a password and AOF."""
        from tests.faults.conftest import free_port

        data = self.folder / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        binds = ["127.0.0.1", *(h.redis_address for h in self.hosts.values())]
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                *binds,
                "--requirepass",
                self.password,
                "--dir",
                str(data),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ],
            stdout=open(data / "redis.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # noqa: SIM115
        client = self.client()
        wait_until(lambda: _pings(client), 20, "the cluster's redis-server to answer")

    def url(self, host: Host | None = None) -> str:
        """The Redis URL as seen from ``host`` (None: from the root namespace, the third host)."""
        address = host.redis_address if host else "127.0.0.1"
        return f"redis://:{self.password}@{address}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url(), decode_responses=True)

    def close(self) -> None:
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.stop(timeout_s=20)
        if self.redis is not None and self.redis.poll() is None:
            self.redis.terminate()
            self.redis.wait(timeout=20)
        for host in self.hosts.values():
            subprocess.run(["ip", "link", "del", host.link], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, timeout=30)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False

"""Redis servers of one test beyond a plain one: TLS certificates, and a primary, a replica and three Sentinels on
free loopback ports (Debian's redis-server runs each Sentinel: ``redis-server sentinel.conf --sentinel``)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

import redis

from tasks.redis_client import free_port, server_argv
from tests.conftest import wait_until

MASTER = "ffmaster"
REPLICATOR = "replicator"
DOWN_AFTER_MS = 1000  # a primary silent this long is down for a Sentinel; 2 of 3 agreeing start the failover


def certificates(folder: Path) -> None:
    """A throw-away CA and a server certificate for 127.0.0.1, made with openssl."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=framefleet-test-ca",
    )
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"
    )
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    )


class SentinelGroup:
    """Primary, replica and Sentinels; ``url`` is the sentinel:// URL every framefleet program is given."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = [free_port(), free_port()]  # the first is the primary at the start
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.servers: dict[int, subprocess.Popen[bytes]] = {}
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.url = ";".join(f"sentinel://127.0.0.1:{p}" for p in self.sentinel_ports) + f"/0?master_name={MASTER}"

    def start(self) -> None:
        primary, replica = self.ports
        self.start_server(primary)
        self.start_server(replica, replica_of=primary)
        wait_until(lambda: self.role(replica) == ("slave", "up"), 20, "the replica to sync")
        for port in self.sentinel_ports:
            conf = self.folder / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.folder}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            log = open(self.folder / f"sentinel-{port}.log", "ab")
            self.sentinels.append(subprocess.Popen(["redis-server", str(conf), "--sentinel"], stdout=log, stderr=log))
        wait_until(lambda: all(self.sentinel_view(p) for p in self.sentinel_ports), 20, "the Sentinels to answer")
        # A Sentinel counts the replica and the other Sentinels before it can fail over.
        wait_until(self._known, 30, "each Sentinel to know the replica and the two other Sentinels")

    def start_server(self, port: int, replica_of: int | None = None) -> None:
        folder = self.folder / f"redis-{port}"
        folder.mkdir(exist_ok=True)
        argv = server_argv(port, folder, persistent=True)
        # Replicas log in as a user of their own on every server (whichever is primary): cut_replicas() turns it off.
        argv += ["--user", REPLICATOR, "on", f">{REPLICATOR}", "~*", "&*", "+@all", "--masteruser", REPLICATOR]
        argv += ["--masterauth", REPLICATOR]
        if replica_of:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        log = open(self.folder / f"redis-{port}.log", "ab")
        self.servers[port] = subprocess.Popen(argv, stdout=log, stderr=log)
        wait_until(lambda: self.role(port), 20, f"redis-server on {port}")

    def role(self, port: int) -> tuple[str, str] | None:
        """('master', '') or ('slave', link status) of the server on ``port``; None when it does not answer."""
        try:
            info = redis.Redis(port=port, socket_timeout=1).info("replication")
        except redis.RedisError:
            return None
        return str(info["role"]), str(info.get("master_link_status", ""))

    def sentinel_view(self, port: int) -> dict | None:
        try:
            return dict(redis.Redis(port=port, socket_timeout=1, decode_responses=True).sentinel_master(MASTER))
        except redis.RedisError:
            return None

    def _known(self) -> bool:
        views = [self.sentinel_view(p) for p in self.sentinel_ports]
        return all(v and int(v["num-slaves"]) >= 1 and int(v["num-other-sentinels"]) >= 2 for v in views)

    def primary_port(self) -> int | None:
        """The port the Sentinels name as the primary now (the first that answers)."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError):
                _, found = redis.Redis(port=port, socket_timeout=1).sentinel_get_master_addr_by_name(MASTER)
                return int(found)
        return None

    def client(self, port: int | None = None) -> redis.Redis:
        return redis.Redis(port=port or self.primary_port() or 0, decode_responses=True, socket_timeout=5)

    def cut_replicas(self, port: int) -> None:
        """Cut the primary on ``port`` off from its replicas (they cannot log in again); it goes on taking writes."""
        client = self.client(port)
        client.execute_command("ACL", "SETUSER", REPLICATOR, "off")
        client.execute_command("CLIENT", "KILL", "TYPE", "replica")

    def kill(self, port: int, sig: int = signal.SIGKILL) -> None:
        proc = self.servers[port]
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait()

    def stop(self) -> None:
        for proc in [*self.sentinels, *self.servers.values()]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a server stopped by a test must end too
                proc.kill()
            proc.wait()

"""`framefleet run`'s private Redis: a random password, kept off command lines, on loopback only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import redis

from tasks.cli.local_auth import REDIS_FILE
from tasks.cli.run import Cluster

pytestmark = pytest.mark.timeout(60)


def test_the_private_redis_asks_for_a_random_password_that_only_its_owner_can_read(tmp_path):
    logs = tmp_path / "out" / "logs"
    urls = []
    for _ in range(2):
        cluster = Cluster(logs)
        try:
            url = cluster.start_redis()
            urls.append(url)
            password = url.partition("://:")[2].partition("@")[0]
            port = int(url.rpartition(":")[2].partition("/")[0])
            assert len(password) >= 24
            with pytest.raises(redis.AuthenticationError):  # NOAUTH: a local user without the password
                redis.Redis(port=port).set("ff:planted", "1")
            authed = redis.Redis.from_url(url, decode_responses=True)
            assert authed.ping() and authed.config_get("bind")["bind"] == "127.0.0.1"
            kept = logs / REDIS_FILE
            assert kept.read_text().strip() == url and stat.S_IMODE(kept.stat().st_mode) == 0o600
            (name, proc) = cluster.procs[0]
            assert name == "redis"
            # ps shows every local user each command line: the password is not on Redis's.
            assert password.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            assert no_password_in(logs, password)
        finally:
            cluster.stop()
    assert urls[0] != urls[1]  # a new password each run


def no_password_in(logs: Path, password: str) -> bool:
    """True when no log in ``logs`` holds ``password`` (only the 0600 auth file may)."""
    return all(password not in p.read_text(errors="replace") for p in logs.glob("*.log"))

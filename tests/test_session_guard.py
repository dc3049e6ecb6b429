"""`make test` stopped by a CI timeout (SIGTERM) or a Ctrl-C leaves no process of its cluster behind: a nested
test run under tests/session_guard.py starts a redis-server and a worker, is killed, and nothing survives."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until
from tests.session_guard import TAG, below, tagged


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_test_run_leaves_no_process_behind(pipeline_env, tmp_path, sig):
    ready = tmp_path / "ready.json"
    env = {**pipeline_env, "NESTED_READY": str(ready)}
    env.pop("FRAMEFLEET_TEST_REDIS", None)  # the nested run starts its own redis-server, as `make test` does
    argv = [sys.executable, str(ROOT / "tests" / "session_guard.py"), sys.executable, "-m", "pytest", "-q"]
    argv += ["-p", "no:cacheprovider", "tests/nested_cluster.py"]
    guard = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: ready.exists() or guard.poll() is not None, 120, "the nested cluster to start")
        assert guard.poll() is None, guard.communicate()[0]
        nested = json.loads(ready.read_text())
        assert nested["tag"] != pipeline_env.get(TAG)  # the guard's own tag, not an outer guard's
        cluster = below(guard.pid)
        assert nested["worker"] in cluster and nested["stray"] in cluster, cluster
        assert len(cluster) >= 4, cluster  # pytest, its redis-server, the worker, the stray process
        assert any(b"redis-server" in Path(f"/proc/{p}/cmdline").read_bytes() for p in cluster)
        guard.send_signal(sig)
        out, _ = guard.communicate(timeout=60)
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait()
    assert guard.returncode != 0, out
    assert tagged(nested["tag"]) == [], out
    assert [p for p in cluster if alive(p)] == [], out
    assert not alive(nested["stray"]) and "session_guard: ended" in out, out  # the guard's end_all, not a teardown

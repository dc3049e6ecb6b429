"""`framefleet run` ends every process it started, its private Redis included, whatever signals arrive while
it shuts down: a second Ctrl-C hurries the shutdown, never aborts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, settings_env, wait_until

SLOW_GPU = "stages:\n  depth:\n    params: {seconds_per_frame: 0.5}\n"  # a task in hand when Ctrl-C comes


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, read from /proc (parent links)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found.update(children)
        todo += children
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_second_ctrl_c_while_the_run_stops_hurries_it_and_leaves_no_process_behind(
    video_factory, pipeline_env, tmp_path
):
    env = {**pipeline_env, **settings_env(tmp_path, SLOW_GPU)}
    env.pop("REDIS_URL")  # a private Redis of its own, which it must end too
    out = tmp_path / "out"
    argv = [sys.executable, str(ROOT / "scripts" / "run_local.py"), str(video_factory(2)), "--out", str(out)]
    argv += ["--cpu-workers", "1", "--gpu-workers", "1"]
    log = tmp_path / "run.log"
    with open(log, "wb") as sink:
        run = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(
            lambda: (
                "ran preprocess" in (out / "logs" / "cpu-1.log").read_text()
                if (out / "logs" / "cpu-1.log").exists()
                else run.poll() is not None
            ),
            120,
            "the run to work",
        )
        assert run.poll() is None, log.read_text()
        started = descendants(run.pid)
        assert any("redis-server" in Path(f"/proc/{p}/cmdline").read_text() for p in started if alive(p))
        run.send_signal(signal.SIGINT)
        wait_until(lambda: "interrupted: stopping" in log.read_text(), 30, "the shutdown to begin")
        run.send_signal(signal.SIGINT)  # as a person does when stopping takes seconds
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 130, log.read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = log.read_text()
    assert "Traceback" not in text and "while stopping: not waiting for the workers' tasks" in text, text
    left = [p for p in started if alive(p)]
    assert not left, [Path(f"/proc/{p}/cmdline").read_text() for p in left]
    assert not [p for p in descendants(os.getpid()) if alive(p) and p in started]

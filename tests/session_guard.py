"""Run a command (the test suite) and, when it ends or is stopped, end every process it left behind.

`make test` runs pytest through this. The tests start redis-servers and celery workers in sessions of their
own (as framefleet does), so a SIGTERM from a CI timeout or a Ctrl-C that ends pytest before its teardown
would leave them running with parent 1. Every process started under the guard inherits the environment
variable TAG with a value of this guard's own (a nested guard sets its own), whatever session or process
group it moves to, and the guard is their subreaper: one whose parent ends is adopted by the guard, not by
init (a redis-server overwrites its environment with its title, so it is found so). When the command has
ended, the guard SIGKILLs every process still carrying the tag or below it.

A signal (SIGINT, SIGTERM, SIGHUP) is passed on to the command, which then has GRACE_S seconds to end
before it is killed too. Exits with the command's status (128 + the signal's number when a signal ended it).
Usage: python tests/session_guard.py COMMAND [ARG ...]
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

TAG = "FRAMEFLEET_TEST_RUN"
GRACE_S = 15.0  # after a signal, how long pytest may take over its own teardown


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name: state, parent, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def below(pid: int) -> list[int]:
    """Every live process below ``pid`` (its children, theirs, ...), read from /proc; zombies are left out."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if entry.name.isdigit() and (fields := _stat(entry.name))[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        children = [p for p, parent in parents.items() if parent == todo[-1]]
        todo.pop()
        found += children
        todo += children
    return found


def subreaper() -> None:
    """Make this process adopt the orphans below it (Linux prctl PR_SET_CHILD_SUBREAPER); elsewhere, nothing."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def tagged(token: str) -> list[int]:
    """The processes (but this one) whose environment holds TAG=``token``, read from /proc."""
    needle = f"{TAG}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def end_all(token: str) -> int:
    """SIGKILL every process tagged ``token`` or below this one until none is left (one may start another
    meanwhile); how many. The adopted ones are reaped."""
    ended: set[int] = set()
    for _ in range(100):
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        left = sorted(set(tagged(token)) | set(below(os.getpid())))
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            ended.add(pid)
        time.sleep(0.05)
    return len(ended)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    subreaper()
    signalled: list[float] = []
    started: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, _frame: object) -> None:
        signalled.append(time.monotonic())
        with contextlib.suppress(ProcessLookupError):
            for child in started:
                child.send_signal(signum)

    # Handled before the command starts, so that it starts with each signal's default action even when this
    # guard inherited SIGINT ignored (a command started with & by a script): the tests that press Ctrl-C on
    # a command they start need it delivered.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    child = subprocess.Popen(argv, env={**os.environ, TAG: token})
    started.append(child)
    while child.poll() is None:
        if signalled and time.monotonic() - signalled[0] > GRACE_S:
            child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=0.2)
    ended = end_all(token)
    if ended:
        print(f"session_guard: ended {ended} process(es) the run left behind ({TAG}={token})", file=sys.stderr)
    code = child.returncode
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

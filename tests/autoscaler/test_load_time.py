"""How long a family's workers take to load, as the autoscaler reads it for the loading cap (service.load_s)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasks.autoscaler.service import load_s
from tasks.autoscaler.supervisor import Slot


@pytest.fixture
def slots():
    """Two slots with live processes (real ones: a slot's pid is its process's), started at 100 s and 104 s."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    made = [Slot(0, n + 1, f"gpu0-{n + 1}", "gpu0", proc=p, started_at=100.0 + 4 * n) for n, p in enumerate(procs)]
    yield made
    for p in procs:
        p.kill()
        p.wait()


def test_unknown_until_a_worker_registers(slots):
    assert load_s(slots, set(), now=130.0) is None


def test_the_longest_load_counts_a_worker_still_loading(slots):
    first, second = slots
    assert load_s(slots, {first.pid}, now=106.0) == 6.0  # the second has loaded 2 s so far
    assert first.loaded_s == 6.0 and second.loaded_s is None
    # the first's time is kept; the second, still loading at 130 s, has taken 26 s: the family is slow now
    assert load_s(slots, {first.pid}, now=130.0) == 26.0
    assert load_s(slots, {first.pid, second.pid}, now=131.0) == 27.0
    assert second.loaded_s == 27.0

"""How many CPU stand-ins for gpu0 run_local starts without a GPU: one per core, as host memory allows."""

from __future__ import annotations

from tasks.cli.run import STAND_IN_MIB, stand_in_workers


def test_one_stand_in_per_core_when_memory_allows():
    assert stand_in_workers(cores=8, free_mib=64 * 1024) == 8


def test_memory_caps_the_stand_ins():
    assert stand_in_workers(cores=8, free_mib=3 * STAND_IN_MIB + 1) == 3


def test_at_least_one_stand_in_whatever_the_memory():
    assert stand_in_workers(cores=4, free_mib=10.0) == 1

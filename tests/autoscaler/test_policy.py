"""The autoscaling policy on simulated GPUs: packing, hysteresis, OOM, idle, unknown peak, host RAM."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.autoscaler.policy import AutoscalePolicy, Decision, GpuView, capacity, decide, one_change

POLICY = AutoscalePolicy(
    headroom_mib=1000,
    max_workers_per_gpu=16,
    cooldown_s=5,
    idle_scale_down_s=60,
    pressure_free_mib=200,
    host_margin_mib=2048,
)


@dataclass
class SimGpu:
    """A GPU whose workers each use ``used_per_worker_mib`` (else the learned ``peak_mib``); a started
    worker registers on the next tick."""

    total_mib: float
    peak_mib: float | None
    backlog: int = 100
    other_mib: float = 0.0
    host_mib: float = 256_000.0
    rss_mib: float = 3000.0
    workers: int = 0
    starting: int = 0
    since_change_s: float = math.inf
    empty_for_s: float = 0.0
    recent_oom: bool = False
    used_per_worker_mib: float | None = None

    def view(self) -> GpuView:
        used = self.other_mib + self.workers * (self.used_per_worker_mib or self.peak_mib or 500.0)
        return GpuView(
            index=0,
            name="Sim GPU",
            total_mib=self.total_mib,
            used_mib=used,
            free_mib=self.total_mib - used,
            other_used_mib=self.other_mib,
            workers=self.workers,
            starting=self.starting,
            backlog=self.backlog,
            peak_mib=self.peak_mib,
            host_free_mib=self.host_mib - self.workers * self.rss_mib,
            worker_rss_mib=self.rss_mib,
            recent_oom=self.recent_oom,
            backlog_empty_for_s=self.empty_for_s,
        )

    def tick(self, policy: AutoscalePolicy, tick_s: float = 1.0, may_change: bool = True) -> str:
        """One tick: decide and act (``may_change`` False: another family of the GPU changes this tick)."""
        self.since_change_s += tick_s
        self.empty_for_s = self.empty_for_s + tick_s if self.backlog == 0 else 0.0
        decision = decide(self.view(), policy, self.since_change_s)
        self.workers, self.starting = self.workers + self.starting, 0
        if not may_change:
            return "hold"
        if decision.action == "up":
            self.starting += decision.count
            self.since_change_s = 0.0
        elif decision.action == "down":
            self.workers -= 1
            self.since_change_s = 0.0
        return decision.action

    def run(self, policy: AutoscalePolicy, ticks: int) -> list[int]:
        counts = []
        for _ in range(ticks):
            self.tick(policy)
            counts.append(self.workers + self.starting)
        return counts


def test_capacity_is_the_floor_of_what_fits():
    assert capacity(10_000, 1000, 3000) == 3
    assert capacity(10_000, 1000, 3000, other_used_mib=500) == 2
    assert capacity(81_920, 2048, 15_000) == 5
    assert capacity(8_000, 1000, 9000) == 0
    with pytest.raises(ValueError, match="peak_mib must be > 0"):
        capacity(10_000, 1000, 0)


@pytest.mark.parametrize(
    ("total", "peak", "expected"), [(10_000, 3000, 3), (24_576, 5000, 4), (81_920, 14_500, 5), (10_000, 9000, 1)]
)
def test_packing_converges_to_capacity_and_never_passes_it(total, peak, expected):
    gpu = SimGpu(total, peak)
    counts = gpu.run(POLICY, 200)
    assert counts[-1] == expected == max(1, math.floor((total - POLICY.headroom_mib) / peak))
    assert max(counts) == expected
    assert "does not fit" in decide(gpu.view(), POLICY, math.inf).reason or expected == 1


@settings(max_examples=60, deadline=None)
@given(
    total=st.floats(4000, 200_000),
    peak=st.floats(500, 40_000),
    headroom=st.floats(0, 4000),
    other=st.floats(0, 8000),
    max_workers=st.integers(1, 8),
)
def test_packing_converges_for_any_gpu(total, peak, headroom, other, max_workers):
    policy = replace(POLICY, headroom_mib=headroom, max_workers_per_gpu=max_workers, pressure_free_mib=0)
    gpu = SimGpu(total, peak, other_mib=other)
    counts = gpu.run(policy, (max_workers + 2) * 7)
    fits = capacity(total, headroom, peak, other)
    assert counts[-1] == max(1, min(fits, max_workers))
    assert max(counts) == counts[-1]


def test_adds_only_while_the_backlog_exceeds_the_workers():
    gpu = SimGpu(80_000, 3000, backlog=2)
    assert gpu.run(POLICY, 60)[-1] == 2
    gpu.backlog = 0
    assert gpu.tick(POLICY) == "hold"


def test_hysteresis_no_change_within_the_cooldown():
    gpu = SimGpu(80_000, 3000)
    actions = [gpu.tick(POLICY) for _ in range(40)]
    changes = [i for i, action in enumerate(actions) if action != "hold"]
    assert len(changes) >= 2
    assert all(b - a >= POLICY.cooldown_s for a, b in zip(changes, changes[1:], strict=False))
    decision = decide(gpu.view(), POLICY, 1.0)
    assert decision.action == "hold" and decision.reason.startswith("cooldown")


def test_a_backlog_that_comes_and_goes_does_not_flap():
    gpu = SimGpu(10_000, 3000)
    gpu.run(POLICY, 30)
    assert gpu.workers == 3
    for i in range(300):  # empty for 40 s, busy for 10 s, and so on: never idle long enough
        gpu.backlog = 0 if i % 50 < 40 else 20
        assert gpu.tick(POLICY) == "hold"


def test_out_of_memory_scales_down_at_once_until_the_raised_peak_fits():
    gpu = SimGpu(10_000, 3000)
    gpu.run(POLICY, 30)
    assert gpu.workers == 3
    gpu.used_per_worker_mib = 3000
    gpu.peak_mib, gpu.recent_oom = 3000 * 1.25, True  # the profile raised after the OOM
    decision = decide(gpu.view(), POLICY, 0.0)  # within the cooldown: an OOM does not wait
    assert decision.action == "down" and "out of memory" in decision.reason
    assert decision.readings["capacity"] == 2 and decision.readings["recent_oom"] is True
    counts = gpu.run(POLICY, 30)
    assert counts[-1] == 2 and min(counts) == 2
    assert "out of memory recently" in decide(gpu.view(), POLICY, math.inf).reason
    gpu.recent_oom = False
    assert gpu.run(POLICY, 30)[-1] == 2  # 3 x 3750 MiB no longer fits


def test_an_oom_when_the_workers_fit_removes_nothing():
    gpu = SimGpu(10_000, 2000, recent_oom=True, workers=2)
    assert decide(gpu.view(), POLICY, 0.0).action == "hold"


def test_memory_pressure_scales_down_at_once_but_not_below_the_minimum():
    gpu = SimGpu(10_000, 3000, workers=3, other_mib=900)  # someone else took 900 MiB: 100 MiB free
    decision = decide(gpu.view(), POLICY, 0.0)
    assert decision.action == "down" and "memory pressure" in decision.reason
    gpu = SimGpu(10_000, 9900, workers=1)
    assert decide(gpu.view(), POLICY, math.inf).action == "hold"


def test_idle_scales_down_to_the_minimum_one_cooldown_apart():
    gpu = SimGpu(20_000, 3000)
    gpu.run(POLICY, 40)
    assert gpu.workers == 6
    gpu.backlog = 0
    actions = [gpu.tick(POLICY) for _ in range(int(POLICY.idle_scale_down_s) + 60)]
    downs = [i for i, a in enumerate(actions) if a == "down"]
    assert len(downs) == 5 and gpu.workers == POLICY.min_workers_per_gpu
    assert downs[0] >= POLICY.idle_scale_down_s - 1
    assert all(b - a >= POLICY.cooldown_s for a, b in zip(downs, downs[1:], strict=False))
    two = replace(POLICY, min_workers_per_gpu=2)
    gpu = SimGpu(20_000, 3000, workers=4, backlog=0, empty_for_s=1000)
    assert gpu.run(two, 60)[-1] == 2


def test_once_the_peak_is_known_the_workers_that_fit_start_at_once():
    gpu = SimGpu(80_000, None, backlog=1000)
    gpu.run(POLICY, 10)
    assert gpu.workers == 1
    gpu.peak_mib = 10_000  # the first task has run: 7 fit in 80000 - 1000 headroom
    decision = decide(gpu.view(), POLICY, math.inf)
    assert (decision.action, decision.count) == ("up", 6) and decision.reason.endswith("6 more")
    # each is checked against the live reading: with 25000 MiB used by something else, 4 fit in all
    busy = replace(gpu.view(), free_mib=gpu.view().free_mib - 25_000)
    assert decide(busy, POLICY, math.inf).count == 4
    # and against the backlog and the host's RAM
    assert decide(replace(gpu.view(), backlog=3), POLICY, math.inf).count == 2
    assert decide(replace(gpu.view(), host_free_mib=3 * 3000 + 2048), POLICY, math.inf).count == 3


def test_without_a_learned_peak_one_worker_only():
    gpu = SimGpu(80_000, None, backlog=1000)
    counts = gpu.run(POLICY, 100)
    assert max(counts) == 1 == counts[-1]
    assert "no learned peak" in decide(gpu.view(), POLICY, math.inf).reason
    gpu.peak_mib = 10_000  # the first task has run
    assert gpu.run(POLICY, 100)[-1] == 7


def test_host_ram_limits_the_workers():
    # 20 GiB of host RAM, 3000 MiB per worker, 2048 MiB margin: with n workers another is added
    # while 20480 - n x 3000 >= 3000 + 2048, i.e. up to n = 5, so 6 in all.
    gpu = SimGpu(200_000, 3000, host_mib=20_480)
    counts = gpu.run(POLICY, 120)
    assert counts[-1] == 6 and max(counts) == 6
    decision = decide(gpu.view(), POLICY, math.inf)
    assert decision.action == "hold" and decision.reason.startswith("host RAM")


def test_starting_workers_count_against_the_capacity():
    view = SimGpu(10_000, 3000, workers=1, backlog=50).view()
    assert decide(replace(view, starting=1), POLICY, math.inf).action == "up"
    assert decide(replace(view, starting=2), POLICY, math.inf).action == "hold"


def test_nothing_changes_while_a_worker_is_stopping():
    view = replace(SimGpu(10_000, 3000, workers=3, other_mib=900).view(), stopping=1)
    decision = decide(view, POLICY, 0.0)
    assert decision.action == "hold" and "to finish their task and stop" in decision.reason


def test_the_first_worker_starts_whatever_the_readings():
    view = SimGpu(1000, None, backlog=0, host_mib=0).view()
    assert decide(view, POLICY, 0.0).action == "up"
    assert decide(replace(view, starting=1), POLICY, math.inf).action == "hold"


def test_above_the_maximum_scales_down():
    view = SimGpu(80_000, 3000, workers=5).view()
    assert decide(view, replace(POLICY, max_workers_per_gpu=4), 0.0).action == "down"


def test_readings_say_what_the_decision_saw():
    readings = decide(SimGpu(10_000, 3000, workers=1).view(), POLICY, 12.345).readings
    assert readings["gpu"] == 0 and readings["capacity"] == 3 and readings["headroom_mib"] == 1000
    assert readings["total_mib"] == 10_000 and readings["since_last_change_s"] == 12.3
    assert decide(SimGpu(10_000, None).view(), POLICY, math.inf).readings["since_last_change_s"] is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"headroom_mib": -1}, "headroom_mib = -1 must be >= 0"),
        ({"max_workers_per_gpu": 0}, "max_workers_per_gpu = 0 must be >= 1"),
        ({"min_workers_per_gpu": 3, "max_workers_per_gpu": 2}, "raise --max-workers-per-gpu"),
    ],
)
def test_a_bad_policy_is_refused_with_the_field_named(change, message):
    with pytest.raises(ValueError, match=message):
        AutoscalePolicy(**change)


def test_two_families_share_a_gpu_each_counting_the_other_as_used():
    # gpu0 (peak 3000) and gpu0.hands (peak 1000) on 10000 MiB with 1000 headroom: each family sees
    # the other's workers x peak as used memory, so together they never pass the usable 9000 MiB.
    main = SimGpu(total_mib=10_000, peak_mib=3000)
    hands = SimGpu(total_mib=10_000, peak_mib=1000)
    for _ in range(40):
        main.other_mib = (hands.workers + hands.starting) * hands.peak_mib
        hands.other_mib = (main.workers + main.starting) * main.peak_mib
        # as the service does: one family of a GPU changes per tick (one_change), the other decides afresh next tick
        views = [replace(main.view(), queue="gpu0"), replace(hands.view(), queue="gpu0.hands")]
        decided = [decide(v, POLICY, g.since_change_s + 1.0) for v, g in zip(views, (main, hands), strict=True)]
        chosen = one_change(views, decided, POLICY)
        main.tick(POLICY, may_change=chosen == 0)
        hands.tick(POLICY, may_change=chosen == 1)
        used = (main.workers + main.starting) * 3000 + (hands.workers + hands.starting) * 1000
        assert used <= 9000
    assert main.workers * 3000 + hands.workers * 1000 > 9000 - 1000  # and they fill it


def _view(queue: str, workers: int, backlog: int) -> GpuView:
    return replace(SimGpu(total_mib=10_000, peak_mib=1000, backlog=backlog, workers=workers).view(), queue=queue)


def _decided(*actions: str) -> list[Decision]:
    return [Decision(action, "test") for action in actions]  # type: ignore[arg-type]


def test_one_change_per_gpu_a_scale_down_first_then_the_neediest_scale_up():
    views = [_view("gpu0", 3, 9), _view("gpu0.hands", 1, 9), _view("gpu0.masks", 0, 0)]
    assert one_change(views, _decided("hold", "hold", "hold"), POLICY) is None
    # a family below its minimum first, then the most tasks waiting per worker
    assert one_change(views, _decided("up", "up", "up"), POLICY) == 2
    assert one_change(views, _decided("up", "up", "hold"), POLICY) == 1
    # downs before ups: the family that ran out of memory, else the one with the most workers
    assert one_change(views, _decided("down", "down", "up"), POLICY) == 0
    assert one_change(views, _decided("down", "down", "up"), POLICY, oomed_queue="gpu0.hands") == 1

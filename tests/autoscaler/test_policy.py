"""The autoscaling policy on simulated GPUs: packing, hysteresis, OOM, idle, unknown peak, host RAM, chains."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tasks.autoscaler.chain import learn_first, leave_room, one_change
from tasks.autoscaler.policy import AutoscalePolicy, Decision, GpuView, capacity, decide

POLICY = AutoscalePolicy(
    headroom_mib=1000,
    max_workers_per_gpu=16,
    cooldown_s=5,
    idle_scale_down_s=60,
    pressure_free_mib=200,
    host_margin_mib=2048,
    max_starting_per_gpu=16,  # the loading cap has its own tests; here every worker that fits may start at once
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
    queue: str = "gpu0"
    upstream: int = 0
    service_s: float | None = None
    service_assumed: bool = False
    running: int = 0

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
            queue=self.queue,
            upstream=self.upstream,
            service_s=self.service_s,
            service_assumed=self.service_assumed,
            running=self.running,
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


def test_at_most_two_workers_of_a_family_load_at_once_and_the_next_step_waits_for_them():
    """The whole real chain on one H200 (docs/archive/notebook.md, "The whole chain on two H200s"): once ViPE's first
    video had ended, depth went from 1 worker to 6 in one step; the five loaded together for 242 s each (73 s alone)
    and the one already working took 42 s a video beside them. These are that tick's readings."""
    depth = GpuView(
        index=0,
        name="NVIDIA H200",
        total_mib=143_771,
        used_mib=50_412.6,
        free_mib=93_358.4,
        other_used_mib=38_346.6,
        workers=1,
        starting=0,
        backlog=10,
        peak_mib=12_610,
        host_free_mib=249_107.7,
        worker_rss_mib=3144.3,
        queue="gpu0.depth",
        upstream=4,
        service_s=39.3,
        running=1,
    )
    default = AutoscalePolicy(cooldown_s=2, max_workers_per_gpu=6)
    assert decide(depth, replace(default, max_starting_per_gpu=16), math.inf).count == 5  # what the GPU did
    step = decide(depth, default, math.inf)
    assert (step.action, step.count) == ("up", 2) and step.reason.endswith("2 more")
    loading = decide(replace(depth, starting=2), default, math.inf)
    assert loading.action == "hold"
    assert loading.reason == "2 worker(s) still loading, the most at once (2): the next step waits for them"
    # one of them up: one more may load beside the other
    assert decide(replace(depth, workers=2, starting=1), default, math.inf).count == 1
    # both up: the next step
    assert decide(replace(depth, workers=3, free_mib=68_138.4), default, math.inf).count == 2
    # a family below its minimum starts them at once (a cluster's first workers)
    two = replace(default, min_workers_per_gpu=3)
    assert decide(replace(depth, workers=0, starting=2), two, math.inf).action == "up"


def test_a_family_that_loads_quickly_starts_every_worker_that_fits_at_once():
    # the synthetic compute-bound model on an H100: 3.9 GB a worker, a few seconds to load
    view = GpuView(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        total_mib=81_559,
        used_mib=4_400,
        free_mib=77_159,
        other_used_mib=0,
        workers=1,
        starting=0,
        backlog=30,
        peak_mib=3_918,
        host_free_mib=240_000,
        worker_rss_mib=1_500,
        load_s=3.2,
    )
    default = AutoscalePolicy(cooldown_s=2, max_workers_per_gpu=8)
    quick = decide(view, default, math.inf)
    assert (quick.action, quick.count) == ("up", 7)
    # a slow load (ViPE's 73 s alone), or none seen yet: two at a time
    assert decide(replace(view, load_s=73.0), default, math.inf).count == 2
    assert decide(replace(view, load_s=None), default, math.inf).count == 2
    # quick: workers still loading do not hold the next step back
    assert decide(replace(view, starting=3, free_mib=65_405), default, math.inf).count == 4
    slow = decide(replace(view, starting=3, free_mib=65_405, load_s=20.0), default, math.inf)
    assert slow.action == "hold" and "still loading" in slow.reason
    # quick_load_s 0: every family keeps to the cap
    assert decide(view, replace(default, quick_load_s=0), math.inf).count == 2


def test_one_loading_at_a_time_still_reaches_capacity():
    gpu = SimGpu(80_000, 10_000, backlog=1000)
    counts = gpu.run(replace(POLICY, max_starting_per_gpu=1, cooldown_s=0), 20)
    assert all(b - a in (0, 1) for a, b in zip(counts, counts[1:], strict=False)), counts
    assert counts[-1] == 7 == max(counts)


@pytest.mark.parametrize("bad", [0, -1])
def test_max_starting_per_gpu_must_let_a_worker_load(bad):
    with pytest.raises(ValueError, match="max_starting_per_gpu"):
        AutoscalePolicy(max_starting_per_gpu=bad)


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
        ({"chain_horizon_s": 0}, "chain_horizon_s = 0 must be > 0"),
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
    # with service times, the family whose next worker gets the most work: 9 tasks x 1 s per 2 workers
    # against 2 waiting + 9 upstream x 2 s per 2
    chain = [replace(views[0], service_s=1.0), replace(views[1], backlog=2, upstream=9, service_s=2.0), views[2]]
    assert one_change(chain, _decided("up", "up", "hold"), POLICY) == 1


@dataclass
class SimChain:
    """One GPU's families ticked as the service does: each counts the others' workers x peaks as used memory
    (their loaded weights while a peak is unknown), growth held while a family with a task has ended none
    (learn_first), one change a tick (one_change), a scale-up of several cut to leave room (leave_room); the
    GPU's cooldown is shared."""

    families: list[SimGpu]
    since_change_s: float = math.inf

    def tick(self, policy: AutoscalePolicy) -> tuple[str, Decision] | None:
        for f in self.families:
            f.other_mib = sum(
                (o.workers + o.starting) * (o.peak_mib or o.used_per_worker_mib or 0.0)
                for o in self.families
                if o is not f
            )
        self.since_change_s += 1.0
        views = [f.view() for f in self.families]
        decided = learn_first(views, [decide(v, policy, self.since_change_s) for v in views], policy)
        chosen = one_change(views, decided, policy)
        for f in self.families:
            f.workers, f.starting = f.workers + f.starting, 0
        if chosen is None:
            return None
        decision, family = leave_room(views, decided, chosen, policy), self.families[chosen]
        if decision.action == "up":
            family.starting += decision.count
        else:
            family.workers -= 1
        self.since_change_s = 0.0
        return family.queue, decision

    def run(self, policy: AutoscalePolicy, ticks: int) -> list[tuple[str, Decision]]:
        changes = []
        for _ in range(ticks):
            if (change := self.tick(policy)) is not None:
                changes.append(change)
            assert self.used_mib() <= self.families[0].total_mib - policy.headroom_mib
        return changes

    def used_mib(self) -> float:
        return sum((f.workers + f.starting) * (f.peak_mib or f.used_per_worker_mib or 0.0) for f in self.families)

    def counts(self) -> dict[str, int]:
        return {f.queue: f.workers + f.starting for f in self.families}


# The whole chain with the real models on an H200 (docs/archive/notebook.md): SAM 3 33.4 GB and 8 s a video, ViPE
# 13.2 GB and 16 s, a 141 GB GPU; SAM 3's first task has ended with 22 videos waiting for it, one in hand.
H200_MIB, SAM3_MIB, VIPE_MIB = 143_771, 33_400, 13_200


def masks_then_depth(depth_peak_mib: float | None = VIPE_MIB, depth_service_s: float = 16.0) -> SimChain:
    masks = SimGpu(H200_MIB, SAM3_MIB, backlog=22, workers=1, queue="gpu0.masks", service_s=8.0)
    depth = SimGpu(H200_MIB, depth_peak_mib, backlog=0, workers=1, queue="gpu0.depth", upstream=22 + 1)
    depth.service_s, depth.used_per_worker_mib = depth_service_s, 6000.0  # ViPE's weights, loaded
    return SimChain([masks, depth])


def test_without_the_chain_the_first_model_takes_the_gpu_and_the_slower_next_one_waits():
    gpu = masks_then_depth()
    for f in gpu.families:  # what the policy saw before it knew the chain
        f.upstream, f.service_s = 0, None
    changes = gpu.run(POLICY, 30)
    assert gpu.counts() == {"gpu0.masks": 3, "gpu0.depth": 1}
    assert [(queue, d.count) for queue, d in changes] == [("gpu0.masks", 2)]
    assert decide(gpu.families[1].view(), POLICY, math.inf).reason == "backlog 0 <= 1 worker(s)"


def test_the_slower_model_downstream_gets_its_workers_first_and_the_first_stops_where_they_fit():
    gpu = masks_then_depth()
    changes = gpu.run(POLICY, 30)
    (first_queue, first), (second_queue, second) = changes
    # ViPE's next worker gets 23 x 16 s / 2 = 184 s of work, SAM 3's 22 x 8 s / 2 = 88 s: depth first, up
    # to 368 s / 60 s = 6 workers, cut to 5 so that a second SAM 3 worker (88 s) fits before a sixth ViPE (61 s)
    assert (first_queue, first.count) == ("gpu0.depth", 4), first.reason
    assert "backlog 0; 23 task(s) upstream: 23 x 16.0 s = 368 s of work >= 6 worker(s)" in first.reason
    assert first.reason.endswith("cut to 4: room kept for 1 x gpu0.masks, which would get more work per worker")
    assert (second_queue, second.count) == ("gpu0.masks", 1)
    assert gpu.counts() == {"gpu0.masks": 2, "gpu0.depth": 5}
    # a third SAM 3 worker would not fit: the chain runs at 2 / 8 s = 0.25 videos/s, not at 1 ViPE's 1 / 16 s
    assert "does not fit" in decide(gpu.families[0].view(), POLICY, math.inf).reason


@pytest.mark.parametrize(("depth_peak_mib", "unknown"), [(None, "peak"), (VIPE_MIB, "seconds per task")])
def test_while_the_downstream_model_is_unknown_the_first_adds_one_worker_at_a_time(depth_peak_mib, unknown):
    gpu = masks_then_depth(depth_peak_mib, depth_service_s=8.0)
    gpu.families[1].service_assumed = True  # ViPE has ended no task: the service gives it SAM 3's 8 s
    queue, decision = gpu.tick(POLICY) or ("", None)
    assert queue == "gpu0.masks" and decision is not None and decision.count == 1
    assert f"cut to 1: room kept for the next worker of gpu0.depth (no {unknown} known yet)" in decision.reason
    # and it does not grow on an assumed time, even with a seeded peak
    held = decide(gpu.families[1].view(), POLICY, math.inf)
    assert held.reason == "backlog 0 <= 1 worker(s); 23 task(s) upstream, its seconds per task not known yet"


def test_the_first_model_waits_for_the_next_ones_first_task_before_it_grows():
    """The GPU run's finding (docs/archive/notebook.md): SAM 3 had ended its first video, ViPE was running its own
    with its time assumed to be SAM 3's, and a single-worker step (a short cooldown) took SAM 3 to 3 workers
    while ViPE, 36 s a video, then fitted 2."""
    gpu = masks_then_depth(depth_service_s=8.9)
    masks, depth = gpu.families
    masks.service_s, masks.workers = 8.9, 2  # the first step (+1) already taken
    depth.service_assumed, depth.running, depth.upstream = True, 1, 21
    views = [f.view() for f in gpu.families]
    alone = decide(views[0], POLICY, math.inf)
    assert alone.action == "up"  # what the policy did on the GPU
    held = learn_first(views, [alone, decide(views[1], POLICY, math.inf)], POLICY)[0]
    assert held.action == "hold"
    assert held.reason.startswith(
        "gpu0.depth has not ended a task yet (0 waiting, 1 running): its seconds per task and its room are not "
        "known; then: backlog 22 > 2 worker(s)"
    )
    assert gpu.run(POLICY, 10) == [] and gpu.counts() == {"gpu0.masks": 2, "gpu0.depth": 1}
    # ViPE's first video ends after 36 s: depth, the slower, now goes first and takes the room
    depth.service_s, depth.service_assumed, depth.running = 36.0, False, 1
    (queue, first), *_ = gpu.run(POLICY, 30)
    assert queue == "gpu0.depth" and first.count >= 3, first.reason
    assert gpu.counts()["gpu0.masks"] == 2 and gpu.counts()["gpu0.depth"] > 2


def test_a_family_no_task_has_reached_holds_nothing_back():
    gpu = masks_then_depth(depth_service_s=8.0)
    gpu.families[1].service_assumed = True  # unknown, but nothing in it: every video may stop before it
    views = [f.view() for f in gpu.families]
    decided = [decide(v, POLICY, math.inf) for v in views]
    assert learn_first(views, decided, POLICY) == decided
    gpu.families[1].backlog = 1  # a task has reached it: the others wait for its first to end
    views = [f.view() for f in gpu.families]
    assert learn_first(views, [decide(v, POLICY, math.inf) for v in views], POLICY)[0].action == "hold"


def test_a_cheap_family_downstream_does_not_grow_on_the_work_upstream():
    tracks = SimGpu(H200_MIB, 600, backlog=0, workers=1, queue="gpu0.tracks", upstream=23, service_s=0.2)
    decision = decide(tracks.view(), POLICY, math.inf)
    assert decision.action == "hold"
    assert decision.reason == (
        "backlog 0 <= 1 worker(s); 23 task(s) upstream: 23 x 0.2 s = 5 s of work < 2 worker(s) x the 60 s horizon"
    )
    assert decision.readings["upstream"] == 23 and decision.readings["wanted"] == 0
    depth = replace(tracks.view(), service_s=16.0, peak_mib=VIPE_MIB)
    assert decide(depth, replace(POLICY, chain_horizon_s=math.inf), math.inf).action == "hold"  # the rule off


view_fields = st.builds(
    SimGpu,
    total_mib=st.floats(4000, 200_000),
    peak_mib=st.one_of(st.none(), st.floats(500, 40_000)),
    backlog=st.integers(0, 40),
    other_mib=st.floats(0, 8000),
    host_mib=st.floats(10_000, 300_000),
    workers=st.integers(0, 6),
    starting=st.integers(0, 2),
    empty_for_s=st.floats(0, 600),
    recent_oom=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(gpu=view_fields, service_s=st.floats(0.01, 100), assumed=st.booleans(), since_s=st.floats(0, 100))
def test_a_gpu_of_one_family_is_scaled_as_without_service_times(gpu, service_s, assumed, since_s):
    view = gpu.view()
    before = decide(view, POLICY, since_s)
    timed = decide(replace(view, service_s=service_s, service_assumed=assumed), POLICY, since_s)
    assert (timed.action, timed.reason, timed.count) == (before.action, before.reason, before.count)
    assert leave_room([view], [before], 0, POLICY) is before
    assert learn_first([view], [before], POLICY) == [before]


@settings(max_examples=60, deadline=None)
@given(
    families=st.lists(
        st.tuples(st.floats(300, 40_000), st.floats(0.05, 30), st.integers(0, 30)), min_size=2, max_size=4
    ),
    total=st.floats(20_000, 150_000),
)
def test_families_of_a_chain_never_pass_the_gpu(families, total):
    sims = [
        SimGpu(total, peak, backlog=backlog, queue=f"gpu0.s{i}", service_s=service)
        for i, (peak, service, backlog) in enumerate(families)
    ]
    for i, sim in enumerate(sims):  # a busy worker of each earlier family holds one task more
        sim.upstream = sum(s.backlog + 1 for s in sims[:i])
    assume(sum(peak for peak, _, _ in families) <= total - POLICY.headroom_mib)  # the minimum of one each fits
    gpu = SimChain(sims)
    gpu.run(replace(POLICY, pressure_free_mib=0), 60)  # asserts the usable memory every tick
    assert all(f.workers >= 1 for f in sims)

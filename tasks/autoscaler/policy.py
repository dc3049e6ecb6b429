"""The autoscaling policy as pure code: from one GPU's readings to "up", "down" or "hold".

``tasks.autoscaler.service`` gathers a ``GpuView`` per worker family each tick, asks ``decide`` for each,
then tasks.autoscaler.chain which family of a GPU changes and by how many workers, and acts on the answer;
nothing here or there reads a GPU, Redis or a clock.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Action = Literal["up", "down", "hold"]


@dataclass(frozen=True)
class AutoscalePolicy:
    """How the autoscaler packs workers on a GPU; memory in MiB, times in seconds.

    ``min_workers_per_gpu`` and ``max_workers_per_gpu`` count the workers of one family (one queue:
    ``gpuN``, or ``gpuN.<stage>`` for a stage with its own python) on a GPU.

    ``cooldown_s``: no change within this long of the last one, except a scale-down on memory
    pressure or after an OOM. ``idle_scale_down_s``: a GPU with nothing waiting and nothing
    running for this long goes down to ``min_workers_per_gpu``. ``pressure_free_mib``: below this
    much free GPU memory, one worker goes. ``host_margin_mib``: host RAM left over after another
    worker's RSS. ``oom_recent_s``: how long an OOM counts as recent (no scale-up, scale-down
    allowed while workers x peak do not fit). ``chain_horizon_s``: a family with work upstream of it on its
    GPU (tasks waiting for, or in, a family of an earlier stage) adds workers for that work before it arrives
    while each of them would get at least this many seconds of it (``wanted``): a slow model downstream starts
    before its input reaches it, a cheap one does not. ``max_starting_per_gpu``: at most this many workers of one
    family load at once on a GPU; a scale-up past it waits for them to come up (loads share the host: on a 32-core
    host five ViPE workers loading together took 242 s each against 73 s alone, and starved the one already
    working). ``quick_load_s``: a family whose workers have each loaded (start to registration) within this long is
    not held to ``max_starting_per_gpu`` once its peak is known: every worker that fits starts at once (a
    compute-bound model loading in seconds otherwise reaches its count two by two); 0 holds every family to it.

    Memory says how many workers fit; measured benefit says whether another is worth adding
    (tasks.autoscaler.benefit). ``busy_pct``: a GPU whose NVML utilisation, averaged over ``busy_window_s``, is at
    least this has no compute to spare: no family grows past its minimum there (over 100: never held so).
    ``min_gain``: a family whose tasks per second rose by less than this fraction when workers last joined it is not
    grown past the count it had before, and, while another family of its GPU has tasks waiting, gives the extra
    workers back; ``trial_tasks``: the tasks each worker ends after a join before that is judged (growth on its own
    queue's tasks holds meanwhile; growth on the work upstream of it does not wait: that work cannot measure it yet);
    ``benefit_retry_s``: how long such a verdict (or an unfinished trial) stands. ``min_work_per_load``: a worker
    past the first is added only while each worker would get at least this many times the family's load time
    (``load_s``) of its known work (``demand_s``), so that a load overlaps work it pays for (0: off).
    Raises ValueError naming a bad value.
    """

    headroom_mib: float = 1024.0
    max_workers_per_gpu: int = 4
    min_workers_per_gpu: int = 1
    cooldown_s: float = 30.0
    idle_scale_down_s: float = 300.0
    pressure_free_mib: float = 512.0
    host_margin_mib: float = 2048.0
    oom_recent_s: float = 120.0
    chain_horizon_s: float = 60.0
    max_starting_per_gpu: int = 2
    quick_load_s: float = 15.0
    busy_pct: float = 90.0
    busy_window_s: float = 10.0
    min_gain: float = 0.05
    trial_tasks: int = 2
    benefit_retry_s: float = 300.0
    min_work_per_load: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0:
                raise ValueError(f"autoscale policy: {f.name} = {value} must be >= 0")
        if self.chain_horizon_s <= 0:
            raise ValueError(
                f"autoscale policy: chain_horizon_s = {self.chain_horizon_s} must be > 0 (inf: no family scales "
                "up on the work upstream of it)"
            )
        if self.max_starting_per_gpu < 1:
            raise ValueError(
                f"autoscale policy: max_starting_per_gpu = {self.max_starting_per_gpu} must be >= 1 (one worker "
                "loading at a time at least)"
            )
        if self.busy_pct <= 0 or self.trial_tasks < 1:
            raise ValueError(
                f"autoscale policy: busy_pct = {self.busy_pct} must be > 0 (over 100: never held) and trial_tasks = "
                f"{self.trial_tasks} >= 1"
            )
        if self.max_workers_per_gpu < max(1, self.min_workers_per_gpu):
            raise ValueError(
                f"autoscale policy: max_workers_per_gpu = {self.max_workers_per_gpu} must be >= 1 and >= "
                f"min_workers_per_gpu = {self.min_workers_per_gpu}; raise --max-workers-per-gpu"
            )


@dataclass(frozen=True)
class GpuView:
    """What the autoscaler knows of one GPU at one tick, for one family of its workers (those of ``queue``).

    A GPU has one family per queue: ``gpuN`` (the stages of the main environment) and ``gpuN.<stage>``
    for each stage with its own python. ``other_used_mib``: memory held by everything but this
    family's workers: other programs, and the GPU's other families (each counted at no less than its
    workers x its learned peak). ``workers``: the family's workers that are registered and alive;
    ``starting``: started (or waiting to be restarted) but not registered yet; ``stopping``: told to
    stop and not gone yet. ``backlog``: tasks waiting in ``queue``. ``peak_mib``: the learned peak of
    one of its workers (None until one is known). ``host_free_mib``: MemAvailable; ``worker_rss_mib``: the largest
    RSS of one of its workers. ``backlog_empty_for_s``: how long nothing has waited or run.

    ``upstream``: tasks that will reach the family from the GPU's families of earlier stages (waiting in their
    queues or running in their workers); 0 for a GPU with one family. ``service_s``: seconds one of its tasks
    takes, the mean over its workers' tasks so far; until one has ended, the slowest of the GPU's other
    families' (``service_assumed``), or None while no family of the GPU has ended a task. ``running``: tasks
    its workers hold now. ``load_s``: the longest any of its workers took from its start to its registration
    (None until one registered).

    The benefit (tasks.autoscaler.benefit): ``busy_pct``, the GPU's NVML utilisation averaged over the policy's
    window (None unknown); ``ceiling``, the workers past which the family's last trial raised no throughput (None:
    no such verdict); ``trial``, an open trial ("" none); ``verdict``, the last trial's figures;
    ``others_waiting``, the tasks waiting in the GPU's other families' queues.
    """

    index: int
    name: str
    total_mib: float
    used_mib: float
    free_mib: float
    other_used_mib: float
    workers: int
    starting: int
    backlog: int
    peak_mib: float | None
    host_free_mib: float
    worker_rss_mib: float
    recent_oom: bool = False
    backlog_empty_for_s: float = 0.0
    stopping: int = 0
    queue: str = ""
    upstream: int = 0
    service_s: float | None = None
    service_assumed: bool = False
    running: int = 0
    load_s: float | None = None
    busy_pct: float | None = None
    ceiling: int | None = None
    trial: str = ""
    verdict: str = ""
    others_waiting: int = 0


@dataclass(frozen=True)
class Decision:
    """One GPU's verdict for this tick, with the readings it was made from.

    ``count``: how many workers an "up" starts at once (1 for any other action).
    """

    action: Action
    reason: str
    readings: dict[str, Any] = field(default_factory=dict)
    count: int = 1


def capacity(total_mib: float, headroom_mib: float, peak_mib: float, other_used_mib: float = 0.0) -> int:
    """How many workers of ``peak_mib`` fit: floor((total - headroom - other_used) / peak), at least 0."""
    if peak_mib <= 0:
        raise ValueError(f"peak_mib must be > 0, got {peak_mib}")
    return max(0, math.floor((total_mib - headroom_mib - other_used_mib) / peak_mib))


def demand_s(view: GpuView) -> float:
    """Seconds of work still to pass through ``view``'s family: its service time x the tasks waiting in it or
    upstream of it on its GPU (a task counts 1 s while no service time is known)."""
    return (view.service_s or 1.0) * (view.backlog + view.upstream)


def wanted(view: GpuView, policy: AutoscalePolicy) -> int:
    """How many workers the family's work asks for: one per task waiting in its queue or, with work upstream of
    it and a service time, as many as each get ``policy.chain_horizon_s`` of the work still to pass through it,
    whichever is more. On a GPU with one family: its backlog. (``decide`` grows a family on its own service
    time only; ``leave_room`` also keeps room for one whose time is assumed: it may be the slowest.)"""
    chain = math.floor(demand_s(view) / policy.chain_horizon_s) if view.upstream and view.service_s else 0
    return max(view.backlog, chain)


def quick_loads(view: GpuView, policy: AutoscalePolicy) -> bool:
    """Whether every worker of ``view``'s family so far loaded within ``policy.quick_load_s`` (False before one has)."""
    return view.load_s is not None and view.load_s < policy.quick_load_s


def decide(view: GpuView, policy: AutoscalePolicy, since_last_change_s: float) -> Decision:
    """Return whether to add a worker to ``view``'s GPU, remove its newest, or hold.

    ``since_last_change_s``: seconds since this GPU's last scale-up or scale-down (inf if none).
    """
    have = view.workers + view.starting
    budget = view.total_mib - policy.headroom_mib - view.other_used_mib
    fits = (
        None
        if view.peak_mib is None
        else capacity(view.total_mib, policy.headroom_mib, view.peak_mib, view.other_used_mib)
    )
    readings = {k: _rounded(v) for k, v in asdict(view).items()}
    want = view.backlog if view.service_assumed else wanted(view, policy)
    readings.update(
        gpu=readings.pop("index"),
        demand_s=_rounded(demand_s(view)),
        wanted=want,
        capacity=fits,
        headroom_mib=policy.headroom_mib,
        since_last_change_s=_rounded(since_last_change_s),
    )

    def verdict(action: Action, reason: str) -> Decision:
        return Decision(action, reason, readings)

    if view.stopping:
        return verdict("hold", f"waiting for {view.stopping} worker(s) to finish their task and stop")
    if have < policy.min_workers_per_gpu:
        return verdict("up", f"{have} worker(s), below the minimum of {policy.min_workers_per_gpu}")
    if have > policy.max_workers_per_gpu:
        return verdict("down", f"{have} workers, above the maximum of {policy.max_workers_per_gpu}")
    if have > policy.min_workers_per_gpu:
        if view.free_mib < policy.pressure_free_mib:
            return verdict(
                "down", f"memory pressure: {view.free_mib:.0f} MiB free, below {policy.pressure_free_mib:.0f} MiB"
            )
        if view.recent_oom and view.peak_mib is not None and have * view.peak_mib > budget:
            return verdict(
                "down",
                f"out of memory: {have} x {view.peak_mib:.0f} MiB peak + "
                f"{view.other_used_mib:.0f} MiB others > {view.total_mib:.0f} MiB - "
                f"{policy.headroom_mib:.0f} MiB headroom",
            )
        if view.backlog_empty_for_s >= policy.idle_scale_down_s and since_last_change_s >= policy.cooldown_s:
            return verdict(
                "down", f"idle for {view.backlog_empty_for_s:.0f} s: down towards {policy.min_workers_per_gpu}"
            )
        retire = view.ceiling is not None and have > view.ceiling and view.others_waiting and not view.starting
        if retire and since_last_change_s >= policy.cooldown_s:
            return verdict(
                "down",
                f"{view.verdict}: {have} worker(s) above the {view.ceiling} that gave the same, and "
                f"{view.others_waiting} task(s) wait for the GPU's other families",
            )
    if since_last_change_s < policy.cooldown_s:
        return verdict("hold", f"cooldown: last change {since_last_change_s:.1f} s ago, under {policy.cooldown_s:g} s")
    if want <= have:
        return verdict("hold", f"backlog {view.backlog} <= {have} worker(s){_chain_note(view, policy, have + 1)}")
    if view.peak_mib is None:
        if have >= 1:
            return verdict("hold", "no learned peak yet: one worker until it has run a task")
        return verdict("up", f"backlog {view.backlog} and no worker{_chain_note(view, policy, 1)}")
    if have >= policy.max_workers_per_gpu:
        return verdict("hold", f"at the maximum of {policy.max_workers_per_gpu} workers")
    if view.trial and view.backlog:  # measured on its own queue's tasks; work upstream only does not wait for it
        return verdict("hold", f"measuring what the last workers gave ({view.trial}): growth waits for it")
    if view.ceiling is not None and have >= view.ceiling:
        return verdict("hold", f"{view.verdict}: not past {view.ceiling} worker(s) though more fit")
    if view.busy_pct is not None and view.busy_pct >= policy.busy_pct:
        return verdict(
            "hold",
            f"the GPU is {view.busy_pct:.0f} % busy (>= {policy.busy_pct:g} % over {policy.busy_window_s:g} s): "
            "another worker adds no compute, though it fits",
        )
    pays = policy.max_workers_per_gpu  # the most workers whose loads the work pays for (min_work_per_load)
    if policy.min_work_per_load and have and view.load_s and view.service_s and not view.service_assumed:
        pays = math.floor(demand_s(view) / (policy.min_work_per_load * view.load_s))
        if pays <= have:
            return verdict(
                "hold",
                f"{demand_s(view):.0f} s of work for {have + 1} worker(s) is under {policy.min_work_per_load:g} x "
                f"the {view.load_s:.0f} s a worker takes to load each: the load would not pay",
            )
    capped = not quick_loads(view, policy)
    if capped and view.starting >= policy.max_starting_per_gpu:
        return verdict(
            "hold",
            f"{view.starting} worker(s) still loading, the most at once ({policy.max_starting_per_gpu}): the next "
            "step waits for them",
        )
    if view.recent_oom:
        return verdict("hold", "out of memory recently: not adding")
    if (have + 1) * view.peak_mib > budget:
        return verdict(
            "hold",
            f"another worker does not fit: {have + 1} x {view.peak_mib:.0f} MiB peak + "
            f"{view.other_used_mib:.0f} MiB others > {view.total_mib:.0f} MiB - "
            f"{policy.headroom_mib:.0f} MiB headroom (capacity {fits})",
        )
    if view.free_mib < policy.headroom_mib:
        return verdict("hold", f"only {view.free_mib:.0f} MiB free, below the {policy.headroom_mib:.0f} MiB headroom")
    if view.host_free_mib < view.worker_rss_mib + policy.host_margin_mib:
        return verdict(
            "hold",
            f"host RAM: {view.host_free_mib:.0f} MiB available < {view.worker_rss_mib:.0f} "
            f"MiB per worker + {policy.host_margin_mib:.0f} MiB margin",
        )
    # With the peak known, go to what fits at once rather than one worker per cooldown: a short run
    # otherwise spends its first part below capacity. Each of the new workers must fit the capacity, the
    # live reading (what is free now, less what the workers still starting will take) and the host's RAM,
    # and no more than max_starting_per_gpu load at once unless the family's loads are quick.
    assert fits is not None
    live = math.floor((view.free_mib - view.starting * view.peak_mib - policy.headroom_mib) / view.peak_mib)
    host_room = view.host_free_mib - view.starting * view.worker_rss_mib - policy.host_margin_mib
    host = math.floor(host_room / view.worker_rss_mib) if view.worker_rss_mib > 0 else policy.max_workers_per_gpu
    loading = policy.max_starting_per_gpu - view.starting if capped else policy.max_workers_per_gpu
    count = max(1, min(want - have, policy.max_workers_per_gpu - have, fits - have, live, host, loading, pays - have))
    why = (
        f"backlog {view.backlog} > {have} worker(s)"
        if want == view.backlog
        else f"backlog {view.backlog}{_chain_note(view, policy, have + count)}"
    )
    return Decision(
        "up", f"{why} and {have + count} x {view.peak_mib:.0f} MiB fit (capacity {fits}): {count} more", readings, count
    )


def _chain_note(view: GpuView, policy: AutoscalePolicy, workers: int) -> str:
    """What the work upstream of the family asks of ``workers`` of it, for a reason; "" without such work."""
    if not view.upstream or not view.service_s:
        return ""
    if view.service_assumed:
        return f"; {view.upstream} task(s) upstream, its seconds per task not known yet"
    ahead, demand = view.backlog + view.upstream, demand_s(view)
    compare = ">=" if demand >= workers * policy.chain_horizon_s else "<"
    return (
        f"; {view.upstream} task(s) upstream: {ahead} x {view.service_s:.1f} s = {demand:.0f} s of work {compare} "
        f"{workers} worker(s) x the {policy.chain_horizon_s:g} s horizon"
    )


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 1) if math.isfinite(value) else None
    return value

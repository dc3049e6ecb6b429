"""The families of one GPU as a chain: which of them changes in a tick, and what the others' growth waits for.

A GPU holds one family per queue (``gpuN``, ``gpuN.<stage>``); ``decide`` (tasks.autoscaler.policy) gives each
family its verdict alone. Here those verdicts meet: ``learn_first`` holds growth while a family has not ended
a task, ``one_change`` picks the one change of the tick, and ``leave_room`` cuts a scale-up of several so that
it leaves room for the workers another family would get first. With one family each is the identity.
"""

from __future__ import annotations

from tasks.autoscaler.policy import AutoscalePolicy, Decision, GpuView, demand_s, wanted


def one_change(
    views: list[GpuView], decisions: list[Decision], policy: AutoscalePolicy, oomed_queue: str | None = None
) -> int | None:
    """Which of one GPU's families changes this tick (an index into ``decisions``), or None: all hold.

    A GPU changes by at most one worker per tick, so that the next reading shows its effect. A
    scale-down goes first: from ``oomed_queue`` (the family whose task last ran out of memory there),
    else from the family with the most workers above the minimum. Else a scale-up: a family below its
    minimum first, else the one whose next worker would get the most work (``demand_s`` / (workers + 1):
    the chain's slowest family, counting what waits upstream of it; with one family, its backlog).
    """

    def have(view: GpuView) -> int:
        return view.workers + view.starting

    downs = [i for i, d in enumerate(decisions) if d.action == "down"]
    if downs:
        return min(downs, key=lambda i: (views[i].queue != oomed_queue, -have(views[i]), i))
    ups = [i for i, d in enumerate(decisions) if d.action == "up"]
    if ups:
        return min(
            ups,
            key=lambda i: (have(views[i]) >= policy.min_workers_per_gpu, -_share_s(views[i], 1), i),
        )
    return None


def learn_first(views: list[GpuView], decisions: list[Decision], policy: AutoscalePolicy) -> list[Decision]:
    """``decisions`` with each scale-up past the minimum held while another family of the GPU has a task in it
    (waiting or running) and has ended none: until its first task ends, its seconds per task are assumed and
    the room it will want is not known, and it may be the chain's slowest. Held for one task's time at most.
    A family no task has reached yet holds nothing (one of other settings, or after a stage every video stops
    at, may never get one), so a family of several stages may grow while its first video is in its later
    stage, before the next family has a task. One family: unchanged.

    Why: on an H200 with the whole real chain, SAM 3 (masks, 8.9 s a video) grew to three workers while
    ViPE (depth, the next stage) ran its first video, with ViPE's time assumed to be SAM 3's; ViPE took 36 s
    and then had room for two workers (docs/archive/notebook.md, "The whole chain on four H200s with the chain-aware
    policy").
    """
    learning = [v for v in views if (v.backlog or v.running) and (v.service_s is None or v.service_assumed)]
    held = []
    for view, decision in zip(views, decisions, strict=True):
        first = next((u for u in learning if u.queue != view.queue), None)
        if decision.action == "up" and view.workers + view.starting >= policy.min_workers_per_gpu and first:
            reason = (
                f"{first.queue} has not ended a task yet ({first.backlog} waiting, {first.running} running): its "
                f"seconds per task and its room are not known; then: {decision.reason}"
            )
            decision = Decision("hold", reason, decision.readings)
        held.append(decision)
    return held


def leave_room(views: list[GpuView], decisions: list[Decision], chosen: int, policy: AutoscalePolicy) -> Decision:
    """``decisions[chosen]``, an "up" of several workers cut so that it leaves room for each worker that another
    family of the GPU wants and would get first, in ``one_change``'s order (most work per next worker); any
    other decision unchanged. The cut keeps at least one worker; a family that would get a worker first and
    has no known peak or an assumed service time keeps the change to one worker (its room is not known)."""
    view, decision = views[chosen], decisions[chosen]
    if decision.action != "up" or decision.count <= 1 or view.peak_mib is None:
        return decision
    have = view.workers + view.starting
    room = view.total_mib - policy.headroom_mib - view.other_used_mib - have * view.peak_mib
    others = [v for i, v in enumerate(views) if i != chosen]
    kept = dict.fromkeys(range(len(others)), 0)  # workers of each other family that come first
    for k in range(1, decision.count + 1):
        for i, other in enumerate(others):
            most = min(wanted(other, policy), policy.max_workers_per_gpu) - other.workers - other.starting
            while kept[i] < most and _share_s(other, kept[i] + 1) > _share_s(view, k):
                if other.peak_mib is None or other.service_assumed:
                    unknown = "peak" if other.peak_mib is None else "seconds per task"
                    return _cut(decision, k - 1, f"the next worker of {other.queue} (no {unknown} known yet)")
                room -= other.peak_mib
                kept[i] += 1
        room -= view.peak_mib
        if room < 0:
            return _cut(decision, k - 1, ", ".join(f"{n} x {others[i].queue}" for i, n in kept.items() if n))
    return decision


def _share_s(view: GpuView, extra: int) -> float:
    """The work (s) each worker of ``view``'s family would have with ``extra`` more."""
    return demand_s(view) / (view.workers + view.starting + extra)


def _cut(decision: Decision, count: int, kept_for: str) -> Decision:
    count = max(1, count)
    if count >= decision.count:
        return decision
    reason = f"{decision.reason}; cut to {count}: room kept for {kept_for}, which would get more work per worker"
    return Decision("up", reason, decision.readings, count)

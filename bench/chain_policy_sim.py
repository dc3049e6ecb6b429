#!/usr/bin/env python3
"""The autoscaler's policy over the whole real chain on one H200, simulated on a CPU: each family scaled by
its own backlog (as before) against the chain's work upstream of it (now).

    python bench/chain_policy_sim.py [--videos 24] [--max-workers-per-gpu 4] [--cooldown-s 30] [--no-seeds] [--reasons]
    python bench/chain_policy_sim.py --compare loading [--load-slots 1.5] [--gpu-share] [--max-starting-per-gpu 2]

The real ``tasks.autoscaler.policy`` decides once a second on views built as ``tasks.autoscaler.service``
builds them (each family counting the others' workers x peaks as used; one change per GPU per tick; the
scale-up of several cut by ``leave_room``). "before" gives it what the service gave it before (no
``upstream``, no ``service_s``, no ``leave_room``). The rest is simulated in steps of 0.1 s from the measured
numbers of bench/NOTEBOOK.md ("The whole chain with every real model under the autoscaler"): per model its
seconds per video alone, its NVML peak and its load time; a 143,771 MiB H200; the videos all preprocessed
at the start. A worker holds its peak from its start, loads for its load time, then takes tasks; a peak is
learned when the family's first task ends (until then the H200 seeds of worker_config.seed_profiles, as in
that run: TAPIP3D 3,010 MiB, WiLoR 16,390 MiB). Not modelled: workers slowing each other on one GPU (three
SAM 3 workers took 15.2 s a video there, 8.0 s alone), the CPU stages, host RAM.

``--compare loading`` runs the chain's policy twice: every worker that fits loading at once (``--max-starting-per-gpu``
16, as before that cap) against the cap given. ``--load-slots S``: workers loading at the same time share the
host, each loading at min(1, S / loading) of its speed alone (1.5 from the 2-GPU H200 run: five ViPE workers
loading together took 242 s each, 73 s alone). ``--gpu-share``: tasks running at the same time share the GPU,
each at 1 / max(1, sum of the running tasks' shares) of its speed alone, a model's share being how much of the
GPU one task takes alone (SAM 3 0.63: three took 15.2 s a video, 8.0 alone; ViPE 1.0: six took 86-92 s, 13.6
alone; TAPIP3D and WiLoR 0.2, not measured).
"""

from __future__ import annotations

import argparse
import math
from collections import deque
from dataclasses import dataclass, field, replace

from tasks.autoscaler.chain import learn_first, leave_room, one_change
from tasks.autoscaler.policy import AutoscalePolicy, Decision, GpuView, decide

TOTAL_MIB = 143_771.0  # an H200 as NVML reads it
STEP_S, TICK_STEPS = 0.1, 10


@dataclass(frozen=True)
class Model:
    stage: str
    service_s: float
    peak_mib: float
    load_s: float
    seed_mib: float | None = None
    gpu_share: float = 1.0  # how much of the GPU one task takes alone (--gpu-share)


CHAIN = (
    Model("masks", 8.0, 33_400.0, 34.0, gpu_share=0.63),  # SAM 3
    Model("depth", 16.0, 13_200.0, 51.0, gpu_share=1.0),  # ViPE
    Model("tracks", 0.2, 600.0, 13.0, 3_010.0, gpu_share=0.2),  # TAPIP3D
    Model("hands", 1.5, 3_700.0, 24.0, 16_390.0, gpu_share=0.2),  # WiLoR
)


@dataclass
class Worker:
    load_left: float  # seconds of loading left, at its speed alone
    video: int | None = None
    work_left: float = 0.0  # seconds of its task left, at its speed alone
    stopping: bool = False

    @property
    def ready(self) -> bool:
        return self.load_left <= 1e-9


@dataclass
class Family:
    model: Model
    queue: deque[int] = field(default_factory=deque)
    workers: list[Worker] = field(default_factory=list)
    tasks: int = 0
    busy_s: float = 0.0
    idle_since: float | None = None

    @property
    def name(self) -> str:
        return f"gpu0.{self.model.stage}"

    def known_peak(self, seeds: bool) -> float | None:
        return self.model.peak_mib if self.tasks else (self.model.seed_mib if seeds else None)

    def active(self) -> list[Worker]:
        return [w for w in self.workers if not w.stopping]


def run(
    videos: int,
    policy: AutoscalePolicy,
    chain: bool,
    seeds: bool = True,
    load_slots: float | None = None,
    gpu_share: bool = False,
) -> dict:
    """Simulate one run; return its finish time, the waits between masks and depth, and every change."""
    fams = [Family(m) for m in CHAIN]
    fams[0].queue.extend(range(videos))
    masks_end: dict[int, float] = {}
    waits: list[float] = []
    changes: list[tuple[float, str, Decision, dict[str, int]]] = []
    finished, last_change, step, most_mib = 0, -math.inf, 0, 0.0
    while finished < videos and step < 100_000:
        t = step * STEP_S
        loading = [w for f in fams for w in f.workers if not w.ready]
        load_rate = min(1.0, load_slots / len(loading)) if load_slots and loading else 1.0
        for w in loading:
            w.load_left -= STEP_S * load_rate
        shares = sum(f.model.gpu_share for f in fams for w in f.workers if w.video is not None)
        task_rate = 1.0 / max(1.0, shares) if gpu_share else 1.0
        for i, fam in enumerate(fams):
            for w in fam.workers:
                if w.video is not None:
                    w.work_left -= STEP_S * task_rate
                if w.video is not None and w.work_left <= 1e-9:
                    fam.tasks, fam.busy_s = fam.tasks + 1, fam.busy_s + fam.model.service_s
                    if i + 1 < len(fams):
                        fams[i + 1].queue.append(w.video)
                    else:
                        finished += 1
                    if i == 0:
                        masks_end[w.video] = t
                    w.video = None
            fam.workers = [w for w in fam.workers if not (w.stopping and w.video is None)]
            for w in fam.workers:
                if w.video is None and not w.stopping and w.ready and fam.queue:
                    w.video, w.work_left = fam.queue.popleft(), fam.model.service_s
                    if i == 1:
                        waits.append(t - masks_end[w.video])
        most_mib = max(most_mib, sum(len(f.workers) * f.model.peak_mib for f in fams))
        if step % TICK_STEPS == 0:
            views = _views(fams, t, chain, seeds)
            decisions = [decide(v, policy, t - last_change) for v in views]
            if chain:
                decisions = learn_first(views, decisions, policy)
            chosen = one_change(views, decisions, policy)
            if chosen is not None:
                decision = leave_room(views, decisions, chosen, policy) if chain else decisions[chosen]
                _act(fams[chosen], decision, t)
                last_change = t
                counts = {f.model.stage: len(f.active()) for f in fams}
                changes.append((t, fams[chosen].model.stage, decision, counts))
        step += 1
    return {"finish_s": step * STEP_S, "waits": waits, "changes": changes, "most_mib": most_mib}


def _views(fams: list[Family], t: float, chain: bool, seeds: bool) -> list[GpuView]:
    used = sum(len(f.workers) * f.model.peak_mib for f in fams)  # a worker holds its peak from its start
    reserved = {
        f.name: len(f.workers) * max(f.model.peak_mib, f.known_peak(seeds) or 0.0) for f in fams
    }  # as the service reserves: measured, or workers x learned peak, whichever is more
    held = {f.name: sum(1 for w in f.workers if w.video is not None) for f in fams}
    known = [f.busy_s / f.tasks for f in fams if f.tasks]
    views = []
    for i, f in enumerate(fams):
        upstream = sum(len(g.queue) + held[g.name] for g in fams[:i]) if chain else 0
        if not f.queue and not held[f.name] and not upstream:
            f.idle_since = t if f.idle_since is None else f.idle_since
        else:
            f.idle_since = None
        active = f.active()
        ready = [w for w in active if w.ready]
        service = (f.busy_s / f.tasks if f.tasks else max(known, default=None)) if chain else None
        views.append(
            GpuView(
                index=0,
                name="NVIDIA H200",
                total_mib=TOTAL_MIB,
                used_mib=used,
                free_mib=TOTAL_MIB - used,
                other_used_mib=sum(r for q, r in reserved.items() if q != f.name),
                workers=len(ready),
                starting=len(active) - len(ready),
                backlog=len(f.queue),
                peak_mib=f.known_peak(seeds),
                host_free_mib=1e9,
                worker_rss_mib=8_000.0,
                backlog_empty_for_s=0.0 if f.idle_since is None else t - f.idle_since,
                stopping=len(f.workers) - len(active),
                queue=f.name,
                upstream=upstream,
                service_s=service,
                service_assumed=chain and not f.tasks and bool(known),
                running=held[f.name],
            )
        )
    return views


def _act(fam: Family, decision: Decision, t: float) -> None:
    if decision.action == "up":
        fam.workers += [Worker(load_left=fam.model.load_s) for _ in range(decision.count)]
    elif decision.action == "down":
        fam.active()[-1].stopping = True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--videos", type=int, default=24)
    p.add_argument("--max-workers-per-gpu", type=int, default=AutoscalePolicy().max_workers_per_gpu)
    p.add_argument("--cooldown-s", type=float, default=AutoscalePolicy().cooldown_s, help="2: as the GPU bench")
    p.add_argument("--no-seeds", action="store_true", help="no seeded peaks: every peak learned from a first task")
    p.add_argument("--reasons", action="store_true", help="print each decision's reason")
    p.add_argument(
        "--compare",
        choices=["chain", "loading"],
        default="chain",
        help="chain: own backlog against the chain; loading: all at once against --max-starting-per-gpu",
    )
    p.add_argument("--max-starting-per-gpu", type=int, default=AutoscalePolicy().max_starting_per_gpu)
    p.add_argument("--load-slots", type=float, help="loads share the host (1.5: the 2-GPU H200 run's)")
    p.add_argument("--gpu-share", action="store_true", help="tasks share the GPU by each model's share")
    args = p.parse_args()
    policy = AutoscalePolicy(
        max_workers_per_gpu=args.max_workers_per_gpu,
        cooldown_s=args.cooldown_s,
        max_starting_per_gpu=args.max_starting_per_gpu,
    )
    print(f"{args.videos} videos, {TOTAL_MIB:,.0f} MiB, {policy}")
    print(f"load slots {args.load_slots}, GPU share {args.gpu_share}")
    if args.compare == "chain":
        runs = {"before: own backlog": (policy, False), "now: the chain": (policy, True)}
    else:
        all_at_once = replace(policy, max_starting_per_gpu=16)
        runs = {"before: all at once": (all_at_once, True), f"now: {args.max_starting_per_gpu} at once": (policy, True)}
    results = {}
    for label, (chosen, chain) in runs.items():
        result = results[label] = run(
            args.videos, chosen, chain, seeds=not args.no_seeds, load_slots=args.load_slots, gpu_share=args.gpu_share
        )
        waits = result["waits"]
        print(f"\n{label}: all {args.videos} videos done at {result['finish_s']:.1f} s")
        print(f"  masks -> depth wait: mean {sum(waits) / len(waits):.1f} s, max {max(waits):.1f} s")
        print(f"  most GPU memory held: {result['most_mib']:,.0f} MiB")
        print("  t (s)  change             masks depth tracks hands")
        for t, stage, decision, counts in result["changes"]:
            change = f"{stage} {decision.action}" + (f" +{decision.count}" if decision.action == "up" else "")
            row = " ".join(f"{counts[m.stage]:>5}" for m in CHAIN)
            print(f"  {t:5.0f}  {change:<18} {row}" + (f"  {decision.reason}" if args.reasons else ""))
    before, now = (r["finish_s"] for r in results.values())
    print(f"\nfinish: {before:.1f} s before, {now:.1f} s now: {before / now:.2f}x")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The autoscaler's policy over the whole real chain on one H200, simulated on a CPU: each family scaled by
its own backlog (as before) against the chain's work upstream of it (now).

    python bench/chain_policy_sim.py [--videos 24] [--max-workers-per-gpu 4] [--cooldown-s 30] [--no-seeds] [--reasons]

The real ``tasks.autoscaler.policy`` decides once a second on views built as ``tasks.autoscaler.service``
builds them (each family counting the others' workers x peaks as used; one change per GPU per tick; the
scale-up of several cut by ``leave_room``). "before" gives it what the service gave it before (no
``upstream``, no ``service_s``, no ``leave_room``). The rest is simulated in steps of 0.1 s from the measured
numbers of bench/RESULTS.md ("The whole chain with every real model under the autoscaler"): per model its
seconds per video alone, its NVML peak and its load time; a 143,771 MiB H200; the videos all preprocessed
at the start. A worker holds its peak from its start, loads for its load time, then takes tasks; a peak is
learned when the family's first task ends (until then the H200 seeds of worker_config.seed_profiles, as in
that run: TAPIP3D 3,010 MiB, WiLoR 16,390 MiB). Not modelled: workers slowing each other on one GPU (three
SAM 3 workers took 15.2 s a video there, 8.0 s alone), the CPU stages, host RAM.
"""

from __future__ import annotations

import argparse
import math
from collections import deque
from dataclasses import dataclass, field

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


CHAIN = (
    Model("masks", 8.0, 33_400.0, 34.0),  # SAM 3
    Model("depth", 16.0, 13_200.0, 51.0),  # ViPE
    Model("tracks", 0.2, 600.0, 13.0, 3_010.0),  # TAPIP3D
    Model("hands", 1.5, 3_700.0, 24.0, 16_390.0),  # WiLoR
)


@dataclass
class Worker:
    ready_at: float
    video: int | None = None
    busy_until: float = 0.0
    stopping: bool = False


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


def run(videos: int, policy: AutoscalePolicy, chain: bool, seeds: bool = True) -> dict:
    """Simulate one run; return its finish time, the waits between masks and depth, and every change."""
    fams = [Family(m) for m in CHAIN]
    fams[0].queue.extend(range(videos))
    masks_end: dict[int, float] = {}
    waits: list[float] = []
    changes: list[tuple[float, str, Decision, dict[str, int]]] = []
    finished, last_change, step, most_mib = 0, -math.inf, 0, 0.0
    while finished < videos and step < 100_000:
        t = step * STEP_S
        for i, fam in enumerate(fams):
            for w in fam.workers:
                if w.video is not None and w.busy_until <= t + 1e-9:
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
                if w.video is None and not w.stopping and w.ready_at <= t and fam.queue:
                    w.video, w.busy_until = fam.queue.popleft(), t + fam.model.service_s
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
        ready = [w for w in active if w.ready_at <= t]
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
        fam.workers += [Worker(ready_at=t + fam.model.load_s) for _ in range(decision.count)]
    elif decision.action == "down":
        fam.active()[-1].stopping = True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--videos", type=int, default=24)
    p.add_argument("--max-workers-per-gpu", type=int, default=AutoscalePolicy().max_workers_per_gpu)
    p.add_argument("--cooldown-s", type=float, default=AutoscalePolicy().cooldown_s, help="2: as the GPU bench")
    p.add_argument("--no-seeds", action="store_true", help="no seeded peaks: every peak learned from a first task")
    p.add_argument("--reasons", action="store_true", help="print each decision's reason")
    args = p.parse_args()
    policy = AutoscalePolicy(max_workers_per_gpu=args.max_workers_per_gpu, cooldown_s=args.cooldown_s)
    print(f"{args.videos} videos, {TOTAL_MIB:,.0f} MiB, {policy}")
    results = {}
    for label, chain in (("before: own backlog", False), ("now: the chain", True)):
        result = results[label] = run(args.videos, policy, chain, seeds=not args.no_seeds)
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

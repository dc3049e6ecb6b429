"""The predecessor's pool with real stage processes: rounds of one process per model stage until one fails.

Used by ``bench/spawn_until_failure.py --stages-config`` (its doc says the rule). Each process is
bench/stage_worker.py started from its stage's interpreter on one GPU; its JSON lines say when it
has loaded and each video it finished. Nothing is retried and nothing watches memory: that is the
baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tasks.autoscaler.service import host_available_mib  # the autoscaler's own host-RAM reading

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Proc:
    """One pool process: its stage, round, process and what it has done."""

    stage: str
    round: int
    proc: subprocess.Popen[bytes]
    log: Path
    loaded: bool = False
    jobs: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    code: int | None = None


class DevicePeak:
    """The peak of a GPU's used memory (NVML, MiB), sampled every 50 ms in a thread; 0 without NVML."""

    def __init__(self, index: int) -> None:
        self.peak_mib, self._stop = 0.0, threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no GPU here: the pool still runs on the CPU, to try the script out
            self._thread = None
            return

        def sample() -> None:
            while not self._stop.is_set():
                self.peak_mib = max(self.peak_mib, pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20)
                self._stop.wait(0.05)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> float:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return round(self.peak_mib, 1)


def last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.is_file() else []
    return lines[-1][:300] if lines else "?"


def run_pool(args: argparse.Namespace) -> dict[str, Any]:
    """Spawn rounds until a process fails (or a cap), then give every loaded process its videos; the outcome."""
    os.environ["FRAMEFLEET_CONFIG"] = str(args.stages_config.resolve())
    from bench.modes_local import jobs_for
    from tasks.celery_app import settings
    from tasks.stages import GPU_STAGES

    conf = settings()
    jobs = jobs_for(args.raw.resolve(), args.inputs.resolve(), run_id="pool")
    stages = [s for s in jobs[0]["chain"] if s in GPU_STAGES]
    logs = args.log_dir or Path(args.inputs).parent / "pool-logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(args.gpu), "OMP_NUM_THREADS": "2"}
    sel = selectors.DefaultSelector()
    procs: list[Proc] = []
    started = time.monotonic()
    peak = DevicePeak(args.gpu)

    def spawn(stage: str, rnd: int) -> None:
        python = conf.stages[stage].python or "python3"
        log = logs / f"{stage}-{rnd}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [python, str(ROOT / "bench" / "stage_worker.py"), stage, "--device", args.device],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=ROOT,
                env=env,
            )
        p = Proc(stage, rnd, proc, log)
        procs.append(p)
        assert proc.stdout is not None
        sel.register(proc.stdout, selectors.EVENT_READ, p)

    def pump(timeout_s: float) -> None:
        for key, _ in sel.select(timeout_s):
            p: Proc = key.data
            stream: IO[bytes] = key.fileobj  # type: ignore[assignment]
            line = stream.readline()
            if not line:
                sel.unregister(stream)
                p.code = p.proc.wait()
                continue
            event = json.loads(line)
            if event["event"] == "loaded":
                p.loaded = True
            elif event["event"] == "done":
                p.done.append(event["video"])
        for p in procs:
            if p.code is None and p.proc.poll() is not None and p.proc.stdout is not None and p.proc.stdout.closed:
                p.code = p.proc.returncode

    def failed() -> list[Proc]:
        return [p for p in procs if p.code not in (None, 0)]

    rounds, stop_reason, next_round = 0, "", started
    while not stop_reason:
        now = time.monotonic()
        if rounds == 0:
            pass  # the first round always starts
        elif failed():
            stop_reason = "a process failed"
        elif rounds >= args.max_rounds:
            stop_reason = f"--max-rounds {args.max_rounds}"
        elif host_available_mib() < args.host_floor_mib:
            stop_reason = f"host RAM below {args.host_floor_mib:.0f} MiB available"
        elif now - started > args.timeout_s / 2:
            stop_reason = "half of --timeout-s spent spawning"
        if not stop_reason and now >= next_round:
            rounds += 1
            for stage in stages:
                spawn(stage, rounds)
            next_round = now + args.every_s
        pump(0.1)
    spawned_s = time.monotonic() - started
    while any(p.code is None and not p.loaded for p in procs) and time.monotonic() - started < args.timeout_s:
        pump(0.2)
    loaded = [p for p in procs if p.loaded and p.code is None]
    load_failures = [p for p in procs if not p.loaded and p.code not in (None, 0)]
    work_began = time.monotonic()
    for stage in stages:
        mine = [p for p in loaded if p.stage == stage]
        for i, p in enumerate(mine):
            p.jobs = [j["video_id"] for j in jobs[i :: len(mine)]]
            text = "".join(json.dumps(j) + "\n" for j in jobs[i :: len(mine)])
            assert p.proc.stdin is not None
            try:
                p.proc.stdin.write(text.encode())
                p.proc.stdin.close()
            except BrokenPipeError:
                pass
    for p in procs:  # the ones that never loaded get nothing: end them
        if p not in loaded and p.code is None:
            p.proc.kill()
    while any(p.code is None for p in procs) and time.monotonic() - started < args.timeout_s:
        pump(0.2)
    for p in procs:
        if p.code is None:
            p.proc.kill()
            p.code = p.proc.wait()
    died = [p for p in loaded if p.code != 0]
    done = {(p.stage, v) for p in procs for v in p.done}
    videos = [j["video_id"] for j in jobs]
    return {
        "gpu": args.gpu,
        "stages": stages,
        "rounds": rounds,
        "stopped_spawning": stop_reason,
        "spawning_s": round(spawned_s, 1),
        "processes": len(procs),
        "loaded": len(loaded),
        "failed_to_load": len(load_failures),
        "first_load_error": last_line(load_failures[0].log) if load_failures else None,
        "died_during_work": len(died),
        "first_work_error": last_line(died[0].log) if died else None,
        "died_by_stage": {s: sum(p.stage == s for p in died) for s in stages},
        "stage_runs_done": len(done),
        "stage_runs_lost": len(videos) * len(stages) - len(done),
        "videos_with_every_stage": sum(all((s, v) in done for s in stages) for v in videos),
        "videos": len(videos),
        "work_s": round(time.monotonic() - work_began, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "gpu_used_peak_mib": peak.stop(),
    }

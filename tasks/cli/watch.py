"""Follow a run until it ends: the progress line, requeues, the stall diagnosis, then the summary.

``framefleet enqueue`` and ``framefleet run`` follow the run they sent; ``framefleet status --watch``
follows any run again (re-attach).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import redis

from tasks.cli.common import fail, plural, printable
from tasks.delivery import requeues
from tasks.observe import progress, stall
from tasks.outputs.intermediates import summary_line
from tasks.records import quarantine
from tasks.redis_client import get_redis
from tasks.run import cancel, runs, sweep
from tasks.workers import registry
from worker_config.settings import Settings

LOSS_CHECK_S = 10.0  # how often the run's messages are looked for; two misses in a row: lost
EARLY_LOOK_S = 15.0  # a concrete cause (a queue without a worker) is said this soon; "busy" waits stall_after_s
LOOK_EVERY_S = 5.0  # a quiet run's queues are scanned at most this often
ETA_SMOOTHING_S = 20.0  # the displayed ETA follows a new estimate with this time constant
CLEAR_TO_END = "\x1b[K"


class Eta:
    """A steadier ETA: the last estimate counts down with the clock and moves toward each new one.

    The raw estimate (elapsed time × work left / work done, in stage tasks) jumps whenever a
    batch of tasks finishes; following it with a time constant keeps the display from jumping.
    """

    def __init__(self, smoothing_s: float = ETA_SMOOTHING_S) -> None:
        self.smoothing_s = smoothing_s
        self.value: float | None = None
        self.at = 0.0

    def update(self, fraction: float, elapsed_s: float, now: float) -> float | None:
        """Seconds left for ``fraction`` (0–1) of the work done in ``elapsed_s``; None before any is done."""
        if fraction <= 0 or elapsed_s <= 0:
            return None
        if fraction >= 1:
            self.value = 0.0
            return 0.0
        raw = elapsed_s * (1 - fraction) / fraction
        if self.value is None:
            self.value = raw
        else:
            counted_down = max(0.0, self.value - (now - self.at))
            weight = 1 - math.exp(-max(0.0, now - self.at) / self.smoothing_s)
            self.value = counted_down + weight * (raw - counted_down)
        self.at = now
        return self.value


def fraction_done(counts: dict[str, int], total: int | None, stages: list[str]) -> float:
    """The share of the run's stage work that is done, counting only videos still to do as work left (0 while
    the run's size is not known). A failed video leaves no work: it neither shortens nor lengthens the ETA,
    whereas counting its skipped stages as done would make a quick failure look like fast progress."""
    if total is None:
        return 0.0
    if not total or not stages:
        return 1.0
    per_video = len(stages)
    done = sum(counts.get(f"{s}.done", 0) for s in stages)
    finished = counts.get("videos.done", 0)
    left_videos = max(0, total - finished - counts.get("videos.failed", 0))
    if not left_videos:
        return 1.0
    # Stages done by videos still in flight (a failed video's earlier stages cannot be told apart: capped).
    in_flight = min(max(0, done - per_video * finished), per_video * left_videos - 1)
    left = per_video * left_videos - in_flight
    return done / (done + left) if done else 0.0


def clock(seconds: float | None) -> str:
    return "--:--:--" if seconds is None else time.strftime("%H:%M:%S", time.gmtime(round(seconds)))


def render(counts: dict[str, int], total: int | None, elapsed_s: float, eta_s: float | None, stages: list[str]) -> str:
    """The one-line progress display (``total`` None: the enqueuer is still walking the folder)."""
    finished = counts.get("videos.done", 0) + counts.get("videos.failed", 0)
    width = 24
    filled = 0 if total is None else int(width * finished / total) if total else width
    done = " ".join(f"{s} {counts.get(s + '.done', 0)}" for s in stages)
    size = "? videos (the folder is being walked)" if total is None else plural(total, "video")
    failed = counts.get("videos.failed", 0)
    left = "" if total is None else f" for {max(0, total - finished)} left"
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{size} | {done} | "
        f"failed {failed} | {elapsed_s:.0f} s elapsed, ETA {clock(eta_s)}{left}"
        + (f" ({failed} failed, not counted)" if failed else "")
    )


def no_cause(r: redis.Redis) -> str:
    """What the workers are doing when no queue lacks a worker: the cause of a quiet run."""
    workers = registry.live_workers(r)
    busy = [w for w in workers if w.get("busy")]
    if busy:
        now = time.time()
        return f"{plural(len(busy), 'worker')} busy with long tasks: " + ", ".join(
            f"{w['hostname']} ({_current(w, now)})" for w in busy
        )
    if not workers:
        return "no live worker at all: start workers (framefleet run starts its own)"
    return "no worker is busy and no task waits"


def _current(worker: dict[str, Any], now: float) -> str:
    current = worker.get("current") or {}
    stage = str(current.get("task", "?")).rsplit(".", 1)[-1]
    since = f", {now - current['started']:.0f} s" if current.get("started") else ""
    return f"{stage} of {current.get('video', '?')}{since}"


def wait_for(conf: Settings, record: dict[str, Any], poll_s: float = 0.5) -> dict[str, Any]:
    """Show the run's progress until its statistics callback has run; return the callback's summary.

    Raises cancel.RunCancelled when the run is cancelled, stall.RunLost when Redis no longer knows
    the run and holds no message of it (seen twice, LOSS_CHECK_S apart).
    """
    from tasks import app

    tty = sys.stdout.isatty()
    stages = conf.enabled_stages()
    eta = Eta()
    last, last_print = "", 0.0
    counts: dict[str, int] = {}
    changed, reported, looked = time.monotonic(), -math.inf, -math.inf
    checked, misses, seen_requeues, seen_resent = time.monotonic(), 0, 0, 0
    run_id = record["run_id"]
    while True:
        try:
            r = get_redis(conf.redis_url)
            now_counts = progress.read(r, run_id)
            if now_counts != counts:
                counts, changed = now_counts, time.monotonic()
            elapsed = time.time() - record["started"]
            if record.get("videos") is None:  # its enqueuer is still walking the folder
                record = {**record, **(runs.lookup(r, run_id) or {})}
            left = eta.update(fraction_done(counts, record["videos"], list(stages)), elapsed, time.monotonic())
            line = render(counts, record["videos"], elapsed, left, list(stages))
            for entry in requeues.read(r, run_id, seen_requeues):
                seen_requeues += 1
                _say(requeues.line(entry), tty)
            for entry in sweep.resent(r, run_id)[seen_resent:]:
                seen_resent += 1
                _say(f"sent {entry['video']} again from {entry['stage']}: its message was gone", tty, sys.stderr)
            quiet = time.monotonic() - changed
            if (
                quiet > min(EARLY_LOOK_S, conf.stall_after_s)
                and time.monotonic() - reported > conf.stall_after_s
                and time.monotonic() - looked > LOOK_EVERY_S
            ):
                looked = time.monotonic()
                why = stall.diagnose(r, get_redis(conf.broker), conf)
                if why or quiet > conf.stall_after_s:
                    reported = time.monotonic()
                    _say(f"no task finished for {quiet:.0f} s: " + ("; ".join(why) or no_cause(r)), tty, sys.stderr)
            if cancel.is_cancelled(r, run_id):
                raise cancel.RunCancelled(f"run {run_id} was cancelled")
            if time.monotonic() - checked > LOSS_CHECK_S:
                checked = time.monotonic()
                # While Redis still knows the run, the workers' sweep (tasks.run.sweep) sends a video whose
                # message is gone; lost is a Redis that lost the run itself (restarted empty, flushed).
                found = runs.lookup(r, run_id) is not None or stall.run_messages(
                    r, get_redis(conf.broker), conf, run_id, record["callback_id"]
                )
                misses = 0 if found else misses + 1
            # Polled without an AsyncResult: its pub/sub outlives a private Redis at teardown.
            meta = app.backend.get_task_meta(record["callback_id"])
            ready = meta["status"] in ("SUCCESS", "FAILURE")
            if misses >= 2 and not ready:
                raise stall.RunLost(
                    f"the messages of run {run_id} are gone from Redis (it restarted "
                    "without persistence, or was flushed)"
                )
        except redis.RedisError as exc:
            line, ready = f"Redis unreachable ({type(exc).__name__}); retrying…", False
        if tty:
            print("\r" + line + CLEAR_TO_END, end="", flush=True)
        elif line != last and (time.time() - last_print > 5 or ready):
            print(line, flush=True)
            last_print = time.time()
        last = line
        if ready:
            if tty:
                print()
            if meta["status"] == "FAILURE":
                raise RuntimeError(f"the statistics callback failed: {meta['result']}")
            return meta["result"]
        time.sleep(poll_s)


def _say(text: str, tty: bool, stream: Any = None) -> None:
    """Print a line of its own, clearing the progress line first on a terminal."""
    if tty:
        print("\r" + CLEAR_TO_END, end="", flush=True)
    print(text, file=stream or sys.stdout, flush=True)


def report(summary: dict[str, Any], out_dir: Path) -> int:
    """Print how the run ended; return the exit status (1 when a video failed)."""
    print(
        f"done: {summary['done']} of {plural(summary['videos'], 'video')}; statistics over "
        f"{plural(summary['statistics_videos'], 'video')} in {out_dir / 'normalization_stats.yaml'}"
    )
    print(f"summary: {out_dir / 'run_summary.json'}; report: {out_dir / 'report.html'}")
    if summary.get("backend_lines"):
        print("made with:")
        for line in summary["backend_lines"]:
            print(f"  {line}")
    if (line := summary_line(out_dir)) is not None:
        print(line)
    if summary["failed"]:
        print(f"failed: {plural(len(summary['failed']), 'video')}:")
        for f in summary["failed"]:
            fields = (f["video"], f["video_id"], f["stage"], f["error_class"], f["reason"])
            print("  {} ({}): {}: {}: {}".format(*map(printable, fields)))
        print(f"quarantined: {out_dir / quarantine.FILE}; after fixing, enqueue them again with --retry-quarantined")
        return 1
    return 0


def cancelled(record: dict[str, Any], out_dir: Path) -> int:
    """Print that the run was cancelled and how to finish it; return exit status 4."""
    raw = record.get("raw_dir", "RAW_DIR")
    print(
        f"\nrun {record['run_id']} was cancelled; complete outputs in {out_dir} are kept. "
        f"`framefleet enqueue {raw} --out {out_dir} --continue` finishes the rest",
        file=sys.stderr,
    )
    return 4


def detached(record: dict[str, Any], out_dir: Path) -> None:
    """After Ctrl-C: the run goes on; say how to follow it again and how to stop it."""
    run_id = record["run_id"]
    print(
        f"\nstopped watching; run {run_id} goes on in the workers.\n"
        f"  follow it again: framefleet status --watch {run_id}   (or: --watch --out {out_dir})\n"
        f"  stop it:         framefleet cancel {run_id}   (complete outputs stay; --continue finishes it)",
        flush=True,
    )


def follow(conf: Settings, record: dict[str, Any]) -> int:
    """Show a run's progress until it ends, as the enqueue command does; return the same exit status."""
    out = Path(record["output_root"])
    if record.get("status") == "finished":
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["finished"]))
        print(f"run {record['run_id']} finished at {when}; summary in {out / 'run_summary.json'}")
        return 0
    print(
        f"following run {record['run_id']} ({plural(record['videos'], 'video')}, outputs in {out}); "
        "Ctrl-C stops watching, not the run",
        flush=True,
    )
    try:
        return report(wait_for(conf, record), out)
    except cancel.RunCancelled:
        return cancelled(record, out)
    except stall.RunLost as exc:
        return fail(f"{exc}; complete outputs are kept: --continue finishes the run", code=3)
    except KeyboardInterrupt:
        detached(record, out)
        return 130

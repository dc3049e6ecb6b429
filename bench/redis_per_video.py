#!/usr/bin/env python3
"""What a finished video leaves in Redis: two `framefleet run`s on one Redis, 10 videos then 30 more.

    python bench/redis_per_video.py [--code DIR] [--work DIR] [--first 10] [--then 30] [--json FILE]

On a private redis-server: `framefleet run RAW --out OUT --intermediates drop` over 10 videos, then
again with `--continue` once 30 more videos were added to RAW. After each run: Redis's ``used_memory`` and the keys by
family (MEMORY USAGE, TTLs), at the run's end and "an hour after" it, simulated by deleting every
key whose remaining TTL is at most an hour (what Redis would have expired by then). Per finished
video: what run 2 added (its 30 videos) over what was left an hour after run 1, so the costs of
a Redis that is used at all (scripts, bindings, the workers' registry) do not count.

``--code DIR`` runs the framefleet of another checkout (e.g. an export of main) with this
script's Python, for the before/after of one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modes_queue import private_redis  # noqa: E402

HOUR_S = 3600


def family(key: str) -> str:
    """A key's family: its prefix without the ids in it (``ff:run:<id>:finished`` → ``ff:run:*:finished``)."""
    if key.startswith("ff:run:") and key.count(":") >= 3:
        return "ff:run:*:" + key.rsplit(":", 1)[1]
    if key.startswith("ff:"):
        return ":".join(key.split(":")[:2])
    for prefix in ("celery-task-meta-", "chord-unlock-", "_kombu.binding.", "unacked"):
        if key.startswith(prefix):
            return prefix.rstrip("-.")
    return key if len(key) < 24 else key[:20] + "…"


def census(r: Any) -> dict[str, Any]:
    """``used_memory`` and, per key family: keys, bytes (MEMORY USAGE) and the largest TTL left (s; -1: none)."""
    families: dict[str, dict[str, Any]] = defaultdict(lambda: {"keys": 0, "bytes": 0, "ttl_s": -2})
    for key in r.scan_iter(count=1000):
        entry = families[family(key)]
        entry["keys"] += 1
        entry["bytes"] += r.memory_usage(key, samples=0) or 0
        ttl = r.ttl(key)
        entry["ttl_s"] = -1 if ttl == -1 or entry["ttl_s"] == -1 else max(entry["ttl_s"], ttl)
    info = r.info("memory")
    memory = {k: info.get(k) for k in ("used_memory", "used_memory_dataset", "used_memory_overhead")}
    memory["used_memory_scripts"] = info.get("used_memory_scripts_eval", info.get("used_memory_scripts"))
    return {**memory, "families": dict(sorted(families.items()))}


class Peak(threading.Thread):
    """The largest ``used_memory`` seen, read every ``every_s`` seconds until stopped."""

    def __init__(self, r: Any, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.r, self.every_s, self.peak, self.stopped = r, every_s, 0, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.peak = max(self.peak, self.r.info("memory")["used_memory"])


def an_hour_later(r: Any) -> int:
    """Delete every key Redis would have expired within the hour; return how many."""
    gone = [k for k in r.scan_iter(count=1000) if 0 <= r.ttl(k) <= HOUR_S]
    for start in range(0, len(gone), 500):
        r.delete(*gone[start : start + 500])
    return len(gone)


def make_videos(work: Path, count: int) -> list[Path]:
    """``count`` tiny sample videos (made once) in WORK/every."""
    every = work / "every"
    if not every.exists():
        subprocess.run(
            [sys.executable, "-m", "tasks.cli.main", "sample", str(every), "--videos", str(count)]
            + ["--seconds", "1-1.5"],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return sorted(p for p in every.iterdir() if p.suffix == ".mp4")[:count]


def add_videos(raw: Path, clips: list[Path]) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    for clip in clips:
        shutil.copy(clip, raw / clip.name)


def framefleet_run(code: Path, raw: Path, out: Path, url: str, *extra: str) -> float:
    """Run `framefleet run RAW --out OUT --intermediates drop` from checkout ``code``; return its seconds."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "run", str(raw), "--out", str(out), "--intermediates", "drop", *extra],
        cwd=code,
        env={**os.environ, "REDIS_URL": url, "PYTHONPATH": str(code)},
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"framefleet run failed ({done.returncode}): {done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def per_video(later: dict[str, Any], earlier: dict[str, Any], videos: int) -> dict[str, Any]:
    """What ``later`` holds beyond ``earlier``, per video: in all, and by family."""
    fams = {}
    for name in sorted(set(later["families"]) | set(earlier["families"])):
        a, b = later["families"].get(name, {}), earlier["families"].get(name, {})
        added = a.get("bytes", 0) - b.get("bytes", 0)
        if added:
            fams[name] = {
                "bytes_per_video": added / videos,
                "keys_per_video": (a.get("keys", 0) - b.get("keys", 0)) / videos,
                "ttl_s": a.get("ttl_s"),
            }
    keys_bytes = sum(f["bytes"] for f in later["families"].values()) - sum(
        f["bytes"] for f in earlier["families"].values()
    )
    return {
        "used_memory_per_video": (later["used_memory"] - earlier["used_memory"]) / videos,
        "key_bytes_per_video": keys_bytes / videos,
        "families": fams,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", type=Path, default=ROOT, help="the framefleet checkout to run")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-redis-per-video"))
    parser.add_argument("--first", type=int, default=10)
    parser.add_argument("--then", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import redis

    args.work.mkdir(parents=True, exist_ok=True)
    clips = make_videos(args.work, args.first + args.then)
    raw, out = args.work / "raw", args.work / "out"
    for folder in (raw, out):
        shutil.rmtree(folder, ignore_errors=True)
    add_videos(raw, clips[: args.first])
    results: dict[str, Any] = {"code": str(args.code), "load": os.getloadavg()}
    with private_redis() as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        results["empty"] = census(r)
        results["run1_s"] = framefleet_run(args.code, raw, out, url)
        results["end1"] = census(r)
        results["expired1"] = an_hour_later(r)
        results["hour1"] = census(r)
        add_videos(raw, clips[args.first :])  # the dataset grew: the same RAW, 30 more videos
        peak = Peak(r)
        peak.start()
        results["run2_s"] = framefleet_run(args.code, raw, out, url, "--continue")
        peak.stopped.set()
        peak.join()
        results["peak2_used_memory"] = peak.peak
        results["end2"] = census(r)
        results["expired2"] = an_hour_later(r)
        results["hour2"] = census(r)
    results["at_end"] = per_video(results["end2"], results["hour1"], args.then)
    results["hour_after"] = per_video(results["hour2"], results["hour1"], args.then)
    results["hour_after_all"] = per_video(results["hour2"], results["empty"], args.first + args.then)
    for when in ("at_end", "hour_after"):
        v = results[when]
        print(
            f"{when}: used_memory {v['used_memory_per_video']:.0f} B/video, keys {v['key_bytes_per_video']:.0f} B/video"
        )
        for name, f in sorted(v["families"].items(), key=lambda kv: -kv[1]["bytes_per_video"]):
            print(
                f"  {name:<26}{f['bytes_per_video']:>9.0f} B/video {f['keys_per_video']:>6.2f} keys/video  "
                f"TTL {f['ttl_s']} s"
            )
    during = (results["peak2_used_memory"] - results["hour1"]["used_memory"]) / args.then
    results["during_per_video"] = during
    print(f"during run 2: used_memory at most {during:.0f} B per video of the run above what run 1 left")
    v = results["hour_after_all"]
    print(
        f"an hour after both runs, over all {args.first + args.then} videos from an empty Redis: used_memory "
        f"{v['used_memory_per_video']:.0f} B/video, keys {v['key_bytes_per_video']:.0f} B/video"
    )
    h = results["hour2"]
    print(
        f"Redis an hour after both runs: used_memory {h['used_memory']} B, of which dataset "
        f"{h['used_memory_dataset']} B, overhead {h['used_memory_overhead']} B, scripts {h['used_memory_scripts']} B"
    )
    print(f"runs: {results['run1_s']:.0f} s, {results['run2_s']:.0f} s; load {results['load']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What 10,000 and 50,000 videos cost: enqueueing, Redis memory, the statistics callback and --continue's check.

    python bench/scale.py [--videos 10000,50000] [--enqueue-videos N,M] [--work DIR] [--end-videos 20]

1. Enqueue: N empty ``.mp4`` files (the enqueuer only lists and stats them) are enqueued as one
   chord against a private Redis with no worker: seconds per phase, then Redis memory (INFO),
   keys by prefix, their TTLs and the bytes of the waiting messages: what N videos in flight hold.
2. The end of a run: ``--end-videos`` tiny real videos through ``scripts/run_local.py`` on another
   private Redis; the keys left per video, by prefix, with their TTLs.
3. The callback and --continue over N complete videos: N work folders whose HDF5 file is a hard
   link to one real file of step 2 and whose marker is that file's (so sizes and partial
   statistics are real); times of ``completed_videos``, ``write_statistics``, the whole
   ``aggregate`` callback with N results (report included, its stage log full), and
   ``tasks.dataset.incomplete`` (size and mtime; full hashing timed on a sample and scaled).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modes_queue import private_redis  # noqa: E402


def prefix_of(key: str) -> str:
    """Group keys by their family: ``ff:claim:…`` → ``ff:claim``, ``celery-task-meta-…`` → ``celery-task-meta``."""
    if key.startswith("ff:"):
        return ":".join(key.split(":")[:2])
    for family in ("celery-task-meta-", "chord-unlock-", "_kombu.binding.", "unacked"):
        if key.startswith(family):
            return family.rstrip("-.")
    return key if len(key) < 24 else key[:20] + "…"


def redis_census(r: Any) -> dict[str, Any]:
    """Memory in use and, per key family: count, bytes (MEMORY USAGE), TTLs (s; -1 none)."""
    families: dict[str, dict[str, Any]] = defaultdict(lambda: {"keys": 0, "bytes": 0, "ttl_s": set()})
    for key in r.scan_iter(count=5000):
        entry = families[prefix_of(key)]
        entry["keys"] += 1
        entry["bytes"] += r.memory_usage(key, samples=0) or 0
        ttl = r.ttl(key)
        entry["ttl_s"].add(ttl if ttl < 0 else round(ttl, -2))
    info = r.info("memory")
    return {
        "used_memory": info["used_memory"],
        "families": {k: {**v, "ttl_s": sorted(v["ttl_s"])[:4]} for k, v in sorted(families.items())},
    }


def enqueue_phase(n: int, work: Path) -> dict[str, Any]:
    from celery import chord  # noqa: F401  (import time is not enqueue time)

    from tasks.dataset import build_chord, find_videos, new_run_id, write_manifest
    from tasks.redis_client import get_redis

    raw, out = work / f"empty-{n}", work / f"enq-out-{n}"
    if not raw.exists():
        raw.mkdir(parents=True)
        for i in range(n):
            (raw / f"v{i:06d}.mp4").touch()
    shutil.rmtree(out, ignore_errors=True)
    r = get_redis(os.environ["REDIS_URL"])
    r.flushall()
    base = r.info("memory")["used_memory"]
    t = {"start": time.perf_counter()}
    videos = find_videos(raw)
    t["find"] = time.perf_counter()
    entries = write_manifest(raw, out, videos, new_run_id())
    t["manifest"] = time.perf_counter()
    canvas, _ = build_chord(entries, raw, out, "scale")
    t["build"] = time.perf_counter()
    canvas.apply_async()
    t["send"] = time.perf_counter()
    census = redis_census(r)
    from tasks.queues import length

    cpu_queue = length(r, "cpu")  # every priority list of the queue
    return {
        "videos": n,
        "find_s": t["find"] - t["start"],
        "manifest_s": t["manifest"] - t["find"],
        "build_chord_s": t["build"] - t["manifest"],
        "send_s": t["send"] - t["build"],
        "total_s": t["send"] - t["start"],
        "redis_bytes_per_video": (census["used_memory"] - base) / n,
        "waiting_messages": cpu_queue,
        "census": census,
    }


def end_state(videos: int, work: Path) -> tuple[dict[str, Any], Path]:
    """Run ``videos`` tiny videos through run_local.py; return the keys left per video and the output folder."""
    raw, out = work / "tiny-raw", work / "tiny-out"
    if not raw.exists():
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "make_sample_dataset.py"),
                str(raw),
                "--videos",
                str(videos),
                "--seconds",
                "1-1.5",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    shutil.rmtree(out, ignore_errors=True)
    with private_redis() as url:
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "run_local.py"), str(raw), "--out", str(out)],
            env={**os.environ, "REDIS_URL": url},
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"run_local.py failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
        import redis

        census = redis_census(redis.Redis.from_url(url, decode_responses=True))
    per_video = {
        k: {"keys_per_video": v["keys"] / videos, "bytes_per_video": v["bytes"] / videos, "ttl_s": v["ttl_s"]}
        for k, v in census["families"].items()
    }
    return {"videos": videos, "families": per_video}, out


def replicate(out: Path, n: int, work: Path) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """A folder of ``n`` complete videos built from one real video of ``out`` (hard links, real marker)."""
    from tasks.stage_io import dataset_file

    vid = sorted(p.stem for p in out.glob("*.hdf5"))[0]
    h5, marker = dataset_file(out, vid)
    record = json.loads(marker.read_text())
    big = work / f"complete-{n}"
    if not (big / "work").exists() or len(list((big / "work").iterdir())) != n:
        shutil.rmtree(big, ignore_errors=True)
        (big / "work").mkdir(parents=True)
        text = json.dumps(record, sort_keys=True)
        for i in range(n):
            name = f"v{i:06d}"
            os.link(h5, big / f"{name}.hdf5")
            (big / "work" / name).mkdir()
            (big / "work" / name / marker.name).write_text(text)
    entries = [{"video_id": f"v{i:06d}"} for i in range(n)]
    job = json.loads((out / "run_summary.json").read_text())
    return big, entries, job


def callback_phase(out: Path, n: int, work: Path, url: str) -> dict[str, Any]:
    import redis

    from tasks import aggregate as agg
    from tasks.dataset import incomplete
    from tasks.metrics import STAGE_LOG_KEPT, STAGE_LOG_KEY
    from tasks.storage import read_marker, sha256_file

    big, entries, summary = replicate(out, n, work)
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    stages = list(summary["stages"])
    now = time.time()
    entry = {"run": "scale", "gpu": 0, "ok": True, "skipped": False, "worker": "gpu0@bench", "run_s": 0.5}
    pipe = r.pipeline(transaction=False)
    for i in range(STAGE_LOG_KEPT):
        s = stages[i % len(stages)]
        pipe.rpush(
            STAGE_LOG_KEY,
            json.dumps(
                {**entry, "video": f"v{i // len(stages):06d}", "stage": s, "start": now + i, "end": now + i + 1}
            ),
        )
    pipe.execute()
    timings = {s: {"start": now, "end": now + 1, "worker": "w", "skipped": False, "run_s": 0.5} for s in stages}
    results = [
        {
            "run_id": "scale",
            "video_id": e["video_id"],
            "video": e["video_id"] + ".mp4",
            "dataset_root": str(big),
            "output_root": str(big),
            "timings": timings,
            "gpu": 0,
            "report": {"windows": 20},
        }
        for e in entries
    ]
    figures: dict[str, Any] = {"videos": n, "results_json_bytes": len(json.dumps(results))}
    t = time.perf_counter()
    records = agg.completed_videos(big)
    figures["completed_videos_s"] = time.perf_counter() - t
    from tasks.stats import VideoStats

    t = time.perf_counter()
    sum((VideoStats.from_dict(r["report"]["stats"]) for r in records.values()), start=VideoStats.empty("3d"))
    figures["merge_one_by_one_s"] = time.perf_counter() - t
    t = time.perf_counter()
    VideoStats.pool([r["report"]["stats"] for r in records.values()], "3d")
    figures["merge_pooled_s"] = time.perf_counter() - t
    t = time.perf_counter()
    agg.write_statistics(big, "3d")
    figures["write_statistics_s"] = time.perf_counter() - t
    t = time.perf_counter()
    agg.aggregate.run(results, {"run_id": "scale", "output_root": str(big), "started": now})
    figures["aggregate_callback_s"] = time.perf_counter() - t
    t = time.perf_counter()
    left = incomplete(entries, big)
    figures["incomplete_s"], figures["incomplete_found"] = time.perf_counter() - t, len(left)
    sample = entries[:200]
    t = time.perf_counter()
    from tasks.stage_io import dataset_file

    for e in sample:
        h5, marker = dataset_file(big, e["video_id"])
        read_marker(h5, marker, check_hash=True)
    figures["hash_every_file_s_scaled"] = (time.perf_counter() - t) * n / len(sample)
    figures["hdf5_bytes"] = (big / "v000000.hdf5").stat().st_size
    t = time.perf_counter()
    sha256_file(big / "v000000.hdf5")
    figures["sha256_one_file_s"] = time.perf_counter() - t
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", default="10000,50000", help="complete videos for the callback and --continue")
    parser.add_argument("--enqueue-videos", help="videos to enqueue (default: --videos)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-scale"))
    parser.add_argument("--end-videos", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip", default="", help="phases to skip: enqueue,end,callback")
    args = parser.parse_args(argv)
    counts = [int(v) for v in args.videos.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    skip = set(args.skip.split(","))
    results: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    with private_redis() as url:
        os.environ["REDIS_URL"] = url  # before tasks is imported: the settings read it once
        if "enqueue" not in skip:
            sizes = [int(v) for v in args.enqueue_videos.split(",")] if args.enqueue_videos else counts
            results["enqueue"] = [enqueue_phase(n, args.work) for n in sizes]
            for e in results["enqueue"]:
                print(
                    f"enqueue {e['videos']}: {e['total_s']:.1f} s (find {e['find_s']:.1f}, manifest "
                    f"{e['manifest_s']:.1f}, build {e['build_chord_s']:.1f}, send {e['send_s']:.1f}); "
                    f"Redis {e['redis_bytes_per_video']:.0f} B per video in flight",
                    flush=True,
                )
        out = args.work / "tiny-out"
        if "end" in skip and not (out / "run_summary.json").exists():
            return 0  # the callback phase needs a real video of the end phase
        end = {"families": {}} if "end" in skip else end_state(args.end_videos, args.work)[0]
        results["end"] = end
        for family, v in end["families"].items():
            print(
                f"end of run: {family:<22}{v['keys_per_video']:>7.2f} keys/video "
                f"{v['bytes_per_video']:>9.0f} B/video  TTL {v['ttl_s']}",
                flush=True,
            )
        if "callback" not in skip:
            results["callback"] = [callback_phase(out, n, args.work, url) for n in counts]
            for c in results["callback"]:
                print(
                    f"{c['videos']} complete videos: completed_videos {c['completed_videos_s']:.2f} s, "
                    f"write_statistics {c['write_statistics_s']:.2f} s (merge one by one "
                    f"{c['merge_one_by_one_s']:.2f} s, pooled {c['merge_pooled_s']:.2f} s), aggregate callback "
                    f"{c['aggregate_callback_s']:.2f} s, incomplete() {c['incomplete_s']:.2f} s "
                    f"(hashing every file instead: {c['hash_every_file_s_scaled']:.1f} s); chord results "
                    f"{c['results_json_bytes'] / 2**20:.1f} MiB",
                    flush=True,
                )
    results["load_after"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

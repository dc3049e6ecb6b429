#!/usr/bin/env python3
"""What 10,000 and 50,000 videos cost: enqueueing, Redis memory, the statistics callback and --continue.

    python bench/scale.py [--videos 10000,50000] [--enqueue-videos N,M] [--chord-videos N,M]
                          [--work DIR] [--end-videos 20] [--skip enqueue,end,callback,continue]

Each phase measures the way a run ended before (one chord; partials read from the markers) and
now (tasks.run.completion's counter and window; tasks.run.partials' hash) in the same sitting.

1. Enqueue: N empty ``.mp4`` files (the enqueuer only lists and stats them) against a private
   Redis with no worker, (a) as one chord of N chains (``--chord-videos``), (b) as the run is
   sent now: the record, the held jobs, the first ``--window`` chains. Seconds per phase, Redis
   memory (INFO) per video in flight, keys by prefix.
2. The end of a run: ``--end-videos`` tiny real videos through ``scripts/run_local.py`` on another
   private Redis; the keys left per video, by prefix, with their TTLs.
3. The callback over N complete videos: N work folders whose HDF5 file is a hard link to one real
   file of step 2 and whose marker is that file's (so sizes and partial statistics are real);
   ``write_statistics`` from the markers and from the partials hash, the whole ``aggregate``
   callback (outcomes from Redis, report included, its stage log full), the chord's message.
4. ``--continue`` over the N complete videos: ``tasks.run.dataset.incomplete`` from the markers, and
   with the partials hash, and the whole ``enqueue(..., resume=True)`` (manifest, check with the
   hash, the statistics callback sent).
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

# The benchmarks measure the orchestration with the synthetic stand-ins, as their recorded results did.
os.environ.setdefault("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")


def prefix_of(key: str) -> str:
    """Group keys by their family: ``ff:claim:…`` → ``ff:claim``, ``celery-task-meta-…`` → ``celery-task-meta``."""
    if key.startswith("ff:run:") and key.count(":") == 3:  # ff:run:<id>:finished, …: tasks.run.completion
        return "ff:run:*:" + key.rsplit(":", 1)[1]
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


def empty_videos(n: int, work: Path) -> Path:
    """A folder of ``n`` empty .mp4 files, v000000.mp4 …"""
    raw = work / f"empty-{n}"
    if not raw.exists():
        raw.mkdir(parents=True)
        for i in range(n):
            (raw / f"v{i:06d}.mp4").touch()
    return raw


def enqueue_phase(n: int, work: Path, how: str, window: int) -> dict[str, Any]:
    """Enqueue ``n`` videos ``how``: "chord" (one chord of every chain) or "window" (tasks.run.completion)."""
    from celery import chord

    from tasks.redis_client import get_redis
    from tasks.run import completion, runs
    from tasks.run.aggregate import aggregate
    from tasks.run.dataset import build_jobs, find_videos, new_run_id, video_chain, write_manifest

    raw, out = empty_videos(n, work), work / f"enq-out-{n}"
    shutil.rmtree(out, ignore_errors=True)
    r = get_redis(os.environ["REDIS_URL"])
    r.flushall()
    base = r.info("memory")["used_memory"]
    t = {"start": time.perf_counter()}
    videos = find_videos(raw)
    t["find"] = time.perf_counter()
    run_id = new_run_id()
    entries = write_manifest(raw, out, videos, run_id)
    t["manifest"] = time.perf_counter()
    jobs, run = build_jobs(entries, raw, out, run_id)
    if how == "chord":
        canvas = chord([video_chain(j) for j in jobs], aggregate.s(run))
        t["build"] = time.perf_counter()
        canvas.apply_async()
    else:
        t["build"] = time.perf_counter()
        record = {**run, "callback_id": "bench-callback", "window": window}
        runs.publish(r, record, 3600)
        completion.hold(r, run_id, jobs[window:], 3600)
        for job in jobs[:window]:
            video_chain(job).apply_async()
    t["send"] = time.perf_counter()
    census = redis_census(r)
    from tasks.delivery.queues import length

    cpu_queue = length(r, "cpu")  # every priority list of the queue
    return {
        "how": how,
        "videos": n,
        "window": window if how == "window" else n,
        "find_s": t["find"] - t["start"],
        "manifest_s": t["manifest"] - t["find"],
        "build_s": t["build"] - t["manifest"],
        "send_s": t["send"] - t["build"],
        "total_s": t["send"] - t["start"],
        "redis_bytes": census["used_memory"] - base,
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
    """A folder of ``n`` complete videos built from one real video of ``out`` (hard links, real marker,
    an empty work folder each), with the ids of the empty videos of ``empty_videos(n)``."""
    from tasks.outputs.stage_io import dataset_file, marked_videos
    from tasks.run.dataset import video_id

    vid = sorted(p.stem for p in out.glob("*.hdf5"))[0]
    h5, marker = dataset_file(out, vid)
    record = json.loads(marker.read_text())
    big = work / f"complete-{n}"
    ids = [video_id(Path(f"v{i:06d}.mp4")) for i in range(n)]
    if len(marked_videos(big)) != n or not dataset_file(big, ids[0])[1].exists():  # made, in today's layout
        shutil.rmtree(big, ignore_errors=True)
        (big / "work").mkdir(parents=True)
        text = json.dumps(record, sort_keys=True)
        source = h5
        for i, name in enumerate(ids):
            if i and i % 30_000 == 0:  # a file system's limit on links to one file (ext4: 65,000)
                source = big / "work" / f".source-{i}.hdf5"
                shutil.copy2(h5, source)  # same size and modification time: the same partial entry
            os.link(source, big / f"{name}.hdf5")
            (big / "work" / name).mkdir()
            where = dataset_file(big, name)[1]
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(text)
    entries = [{"video_id": name} for name in ids]
    job = json.loads((out / "run_summary.json").read_text())
    return big, entries, job


def fill_partials(r: Any, big: Path, ids: list[str]) -> None:
    """The entries the h5 stage would have left in tasks.run.partials' hash for ``ids`` (one real partial)."""
    from tasks.outputs.stage_io import dataset_file
    from tasks.run import partials

    h5, marker = dataset_file(big, ids[0])
    stats = json.loads(marker.read_text())["report"]["stats"]
    kept = partials.HEADER.pack(h5.stat().st_size, h5.stat().st_mtime_ns, b"3d") + partials.encode(stats, "3d")
    pipe = r.pipeline(transaction=False)
    for vid in ids:
        pipe.hset(partials.redis_key(big), vid, kept + vid.encode())
    pipe.execute()


def callback_phase(out: Path, n: int, work: Path, url: str) -> dict[str, Any]:
    import redis

    from tasks.observe.metrics import STAGE_LOG_KEPT, stage_log_key
    from tasks.run import aggregate as agg
    from tasks.run import completion, partials
    from tasks.run.stats import VideoStats, normalization_stats, write_stats_yaml

    big, entries, summary = replicate(out, n, work)
    partials.file_path(big).unlink(missing_ok=True)  # an earlier sitting's: "from the markers" reads markers
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    stages = list(summary["stages"])
    now = time.time()
    entry = {"gpu": 0, "ok": True, "skipped": False, "worker": "gpu0@bench", "run_s": 0.5}
    pipe = r.pipeline(transaction=False)
    for i in range(STAGE_LOG_KEPT):
        s = stages[i % len(stages)]
        pipe.rpush(
            stage_log_key("scale"),
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
    # What the finishing tasks leave in Redis: each video's outcome and its partial statistics.
    t = time.perf_counter()
    fill_partials(r, big, [e["video_id"] for e in entries])
    pipe = r.pipeline(transaction=False)
    for e in results:
        pipe.hset(completion.key("scale", ":finished"), e["video_id"], json.dumps(e))
    pipe.execute()
    figures: dict[str, Any] = {
        "videos": n,
        "chord_message_bytes": len(json.dumps([results, {"run_id": "scale"}])),
        "fill_redis_s": time.perf_counter() - t,
        "partials_hash_bytes": r.memory_usage(partials.redis_key(big), samples=0),
        "outcomes_hash_bytes": r.memory_usage(completion.key("scale", ":finished"), samples=0),
    }
    # Before: every marker read, the partials pooled from their dicts (the old write_statistics).
    t = time.perf_counter()
    records = agg.completed_videos(big)
    figures["completed_videos_s"] = time.perf_counter() - t
    t = time.perf_counter()
    total = VideoStats.pool([r["report"]["stats"] for r in records.values()], "3d")
    figures["merge_pooled_s"] = time.perf_counter() - t
    write_stats_yaml(big / "normalization_stats.yaml", normalization_stats(total))
    figures["write_statistics_before_s"] = time.perf_counter() - t + figures["completed_videos_s"]
    before = (big / "normalization_stats.yaml").read_text()
    # Now: without Redis (every marker), then with the partials hash.
    t = time.perf_counter()
    agg.write_statistics(big, "3d", None)
    figures["write_statistics_markers_s"] = time.perf_counter() - t
    same = before == (big / "normalization_stats.yaml").read_text()
    t = time.perf_counter()
    agg.write_statistics(big, "3d", r)
    figures["write_statistics_hash_s"] = time.perf_counter() - t
    figures["same_statistics"] = same and before == (big / "normalization_stats.yaml").read_text()
    run = {"run_id": "scale", "output_root": str(big), "started": now, "videos": n, "already_complete": 0}
    t = time.perf_counter()
    agg.aggregate.run(run)
    figures["aggregate_callback_s"] = time.perf_counter() - t
    # The run has ended and Redis has let its copies go: the statistics from OUT/markers/partials.bin.
    r.flushall()
    t = time.perf_counter()
    agg.write_statistics(big, "3d", None)
    figures["write_statistics_file_s"] = time.perf_counter() - t
    figures["same_statistics_file"] = before == (big / "normalization_stats.yaml").read_text()
    figures["partials_file_bytes"] = partials.file_path(big).stat().st_size
    return figures


def continue_phase(n: int, work: Path, url: str) -> dict[str, Any]:
    """--continue over ``n`` complete videos: incomplete() alone, then the whole enqueue."""
    import redis

    from tasks.celery_app import settings
    from tasks.cli.enqueue import enqueue
    from tasks.outputs.stage_io import marked_videos
    from tasks.run import partials
    from tasks.run.dataset import incomplete

    big = work / f"complete-{n}"
    entries = [{"video_id": vid} for vid in sorted(marked_videos(big))]
    r = redis.Redis.from_url(url)
    r.flushall()
    partials.file_path(big).unlink(missing_ok=True)
    t = time.perf_counter()
    left = incomplete(entries, big)
    figures: dict[str, Any] = {"videos": n, "incomplete_s": time.perf_counter() - t, "incomplete_found": len(left)}
    fill_partials(r, big, [e["video_id"] for e in entries])
    t = time.perf_counter()
    left = incomplete(entries, big, r)
    figures["incomplete_hash_s"], figures["incomplete_hash_found"] = time.perf_counter() - t, len(left)
    partials.save(big, partials.read(r, big))  # what a run's end leaves: the file, and Redis without the copy
    r.flushall()
    t = time.perf_counter()
    left = incomplete(entries, big)
    figures["incomplete_file_s"], figures["incomplete_file_found"] = time.perf_counter() - t, len(left)
    (big / "manifest.json").unlink(missing_ok=True)
    t = time.perf_counter()
    record = enqueue(settings(), empty_videos(n, work), big, resume=True)
    figures["enqueue_continue_s"] = time.perf_counter() - t
    figures["enqueue_continue_sent"] = record["videos"]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", default="10000,50000", help="complete videos for the callback and --continue")
    parser.add_argument("--enqueue-videos", default="1000,2000,10000,50000", help="videos to enqueue now")
    parser.add_argument("--chord-videos", default="1000,2000", help="videos to enqueue as one chord (before)")
    parser.add_argument("--window", type=int, default=64, help="videos in flight when enqueued now")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-scale"))
    parser.add_argument("--end-videos", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip", default="", help="phases to skip: enqueue,end,callback,continue")
    args = parser.parse_args(argv)
    counts = [int(v) for v in args.videos.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    skip = set(args.skip.split(","))
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    with private_redis() as url:
        os.environ["REDIS_URL"] = url  # before tasks is imported: the settings read it once
        if "enqueue" not in skip:
            plan = [("chord", int(v)) for v in args.chord_videos.split(",") if v]
            plan += [("window", int(v)) for v in args.enqueue_videos.split(",") if v]
            results["enqueue"] = []
            for how, n in plan:
                e = enqueue_phase(n, args.work, how, args.window)
                results["enqueue"].append(e)
                print(
                    f"enqueue {n} as {how} ({e['window']} sent): {e['total_s']:.2f} s (find {e['find_s']:.2f}, "
                    f"manifest {e['manifest_s']:.2f}, build {e['build_s']:.2f}, send {e['send_s']:.2f}); "
                    f"Redis {e['redis_bytes'] / 2**20:.1f} MiB, {e['redis_bytes_per_video']:.0f} B per video; "
                    f"{e['waiting_messages']} messages waiting",
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
            results["callback"] = []
            for n in counts:
                c = callback_phase(out, n, args.work, url)
                results["callback"].append(c)
                print(
                    f"{n} complete videos: write_statistics before {c['write_statistics_before_s']:.2f} s, now "
                    f"from the markers {c['write_statistics_markers_s']:.2f} s, "
                    f"from the hash {c['write_statistics_hash_s']:.2f} s (same file: {c['same_statistics']}; "
                    f"completed_videos {c['completed_videos_s']:.2f} s, pooled merge {c['merge_pooled_s']:.2f} s); "
                    f"aggregate callback {c['aggregate_callback_s']:.2f} s; chord message "
                    f"{c['chord_message_bytes'] / 2**20:.1f} MiB; in Redis: outcomes "
                    f"{c['outcomes_hash_bytes'] / 2**20:.1f} MiB, partials {c['partials_hash_bytes'] / 2**20:.1f} MiB; "
                    f"after the run, from OUT/markers/partials.bin ({c['partials_file_bytes'] / 2**20:.1f} MiB) "
                    f"{c['write_statistics_file_s']:.2f} s (same file: {c['same_statistics_file']})",
                    flush=True,
                )
        if "continue" not in skip:
            results["continue"] = []
            for n in counts:
                c = continue_phase(n, args.work, url)
                results["continue"].append(c)
                print(
                    f"--continue over {n} complete videos: incomplete() from the markers {c['incomplete_s']:.2f} s "
                    f"({c['incomplete_found']} found), with the hash {c['incomplete_hash_s']:.2f} s "
                    f"({c['incomplete_hash_found']} found), with the file {c['incomplete_file_s']:.2f} s "
                    f"({c['incomplete_file_found']} found), the whole enqueue {c['enqueue_continue_s']:.2f} s "
                    f"({c['enqueue_continue_sent']} sent)",
                    flush=True,
                )
    results["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

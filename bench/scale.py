#!/usr/bin/env python3
"""What 10,000 and 50,000 videos cost: enqueueing, Redis memory, the statistics callback and --continue.

    python bench/scale.py [--videos 10000,50000] [--enqueue-videos N,M] [--chord-videos N,M]
                          [--work DIR] [--end-videos 20] [--skip enqueue,end,callback,continue,sums]
                          [--sums-videos 10000,100000,1000000] [--sums-baseline 10000,100000]

Each phase measures the way a run ended before (one chord; partials read from the markers) and
now (tasks.run.completion's counter and window; tasks.statistics.partials' hash) in the same sitting.

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
5. The statistics of a run of N videos (``--sums-videos``) from its running sums (tasks.statistics.sums):
   N partials of the real video's size and layout, varied per video, merged in a random order as the
   h5 stages would (one EVALSHA each, pipelined), N outcomes kept as tasks.records.outcomes keeps them
   (the real marker's report, per-video source and timings); the Redis memory the run added and by
   key, the statistics (``write_statistics_from`` over an OUT of N markers), their largest relative
   difference from pooling the same rows in one NumPy pass, reading the outcomes back, and
   ``framefleet status`` with that Redis. With ``--sums-baseline`` also as before: the partials hash,
   JSON outcomes and the full pass over N replicated real files (step 3's folder).
6. A live run of N videos (``--live-videos``; bench/live_run.py): every structure it holds in Redis at
   once (pending jobs, outcomes, order, sums and merged marks, stage log, done marks and start counts),
   ``used_memory`` per structure when enqueued and at its last window, with main's done marks and start
   counts in the same Redis for the baseline; then, with the largest run left in Redis, ``framefleet
   status``, the sweep's and cancel's reads, and real Flower's HTTP API, against the same on a run of
   ``--live-small`` videos.
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

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from bench.modes_queue import private_redis  # noqa: E402
from bench.simulated import earlier_line, realistic_outcome, realistic_partials, sharded_path  # noqa: E402

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
    """The entries the h5 stage would have left in tasks.statistics.partials' hash for ``ids`` (one real partial)."""
    from tasks.outputs.stage_io import dataset_file
    from tasks.statistics import partials

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
    from tasks.run import completion
    from tasks.statistics import partials, stats_file
    from tasks.statistics.stats import VideoStats, normalization_stats, write_stats_yaml

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
    records = stats_file.completed_videos(big)
    figures["completed_videos_s"] = time.perf_counter() - t
    t = time.perf_counter()
    total = VideoStats.pool([r["report"]["stats"] for r in records.values()], "3d")
    figures["merge_pooled_s"] = time.perf_counter() - t
    write_stats_yaml(big / "normalization_stats.yaml", normalization_stats(total))
    figures["write_statistics_before_s"] = time.perf_counter() - t + figures["completed_videos_s"]
    before = (big / "normalization_stats.yaml").read_text()
    # Now: without Redis (every marker), then with the partials hash.
    t = time.perf_counter()
    stats_file.write_statistics(big, "3d", None)
    figures["write_statistics_markers_s"] = time.perf_counter() - t
    same = before == (big / "normalization_stats.yaml").read_text()
    t = time.perf_counter()
    stats_file.write_statistics(big, "3d", r)
    figures["write_statistics_hash_s"] = time.perf_counter() - t
    figures["same_statistics"] = same and before == (big / "normalization_stats.yaml").read_text()
    run = {"run_id": "scale", "output_root": str(big), "started": now, "videos": n, "already_complete": 0}
    t = time.perf_counter()
    agg.aggregate.run(run)
    figures["aggregate_callback_s"] = time.perf_counter() - t
    # The run has ended and Redis has let its copies go: the statistics from OUT/markers/partials.bin.
    r.flushall()
    t = time.perf_counter()
    stats_file.write_statistics(big, "3d", None)
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
    from tasks.run.dataset import incomplete
    from tasks.statistics import partials

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


# The statistics at a million videos (issue 25): the run's running sums (tasks.statistics.sums) against the
# full pass, with what the run holds in Redis for its outcomes and partials.


def marker_names(n: int, work: Path) -> tuple[Path, list[str]]:
    """An OUT of ``n`` videos' markers (empty files in their 256 shards: the sums read only their names)."""
    from tasks.outputs.stage_io import MARKER_SUFFIX, MARKERS_DIR, marker_shard
    from tasks.run.dataset import video_id

    root = work / f"names-{n}"
    ids = [video_id(Path(f"v{i:07d}.mp4")) for i in range(n)]
    done = root / ".made"
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        for shard in {marker_shard(v) for v in ids[:5000]} | {f"{i:02x}" for i in range(256)}:
            (root / MARKERS_DIR / shard).mkdir(parents=True, exist_ok=True)
        for vid in ids:
            os.close(
                os.open(root / MARKERS_DIR / marker_shard(vid) / (vid + MARKER_SUFFIX), os.O_CREAT | os.O_WRONLY, 0o644)
            )
        done.touch()
    return root, ids


def sums_phase(n: int, work: Path, url: str, tiny: Path, baseline: bool) -> dict[str, Any]:
    """What a run of ``n`` videos holds in Redis for its outcomes and partials, and its statistics: now
    (running sums, compact outcomes) and, with ``baseline``, as before (the partials hash, JSON outcomes,
    the full pass over replicated real files)."""
    import redis

    from tasks.celery_app import settings
    from tasks.cli import status
    from tasks.outputs.stage_io import dataset_file
    from tasks.records import outcomes
    from tasks.run import completion, runs
    from tasks.statistics import partials, stats_file, sums
    from tasks.statistics.stats import normalization_stats, pool_rows

    vid0 = sorted(p.stem for p in tiny.glob("*.hdf5"))[0]
    h5, marker_path = dataset_file(tiny, vid0)
    marker = json.loads(marker_path.read_text())
    summary = json.loads((tiny / "run_summary.json").read_text())
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    figures: dict[str, Any] = {"videos": n}
    t = time.perf_counter()
    root, ids = marker_names(n, work)
    figures["make_markers_s"] = time.perf_counter() - t
    rows = realistic_partials(marker, n)
    header = partials.HEADER.pack(h5.stat().st_size, h5.stat().st_mtime_ns, b"3d")
    run_id = f"sums-{n}"
    record = {
        "run_id": run_id,
        "output_root": str(root),
        "started": summary["started"],
        "videos": n,
        "already_complete": 0,
        "callback_id": "bench",
    }
    runs.publish(r, record, 3600)
    base = r.info("memory")["used_memory"]
    # What the finishing tasks do, one video at a time in a run: the merge (one EVALSHA) and the outcome.
    shards, script = sums.shard_count(n), sums.merge_script()
    order = np.random.default_rng(1).permutation(n)  # videos finish in any order
    t = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for k, i in enumerate(order):
        script(*sums.merge_call(run_id, shards, ids[i], header + rows[i].astype("<f8").tobytes(), 3600), client=pipe)
        if k % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    figures["merge_s"] = time.perf_counter() - t
    t = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    finished = completion.key(run_id, ":finished")
    for k, i in enumerate(order):
        packed = outcomes.encode(r, run_id, realistic_outcome(marker, summary, ids[i], int(i)), 3600)
        pipe.hset(finished, ids[i], packed)
        if k % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    figures["outcomes_s"] = time.perf_counter() - t
    marks = [k for k in sums.shard_keys(run_id, shards) if r.exists(k)]
    figures.update(
        used_memory_run=r.info("memory")["used_memory"] - base,
        sums_bytes=r.memory_usage(sums.sums_key(run_id), samples=0),
        marks_bytes=sum(r.memory_usage(k, samples=0) for k in marks),
        marks_keys=len(marks),
        marks_listpack=sum(r.object("encoding", k) == "listpack" for k in marks),
        outcomes_bytes=r.memory_usage(finished, samples=0) + r.memory_usage(outcomes.dict_key(run_id), samples=0),
    )
    # The statistics at the run's end: the sums cover OUT's n markers.
    t = time.perf_counter()
    merged, source = stats_file.write_statistics_from(root, "3d", r, None, run_id)
    figures["statistics_s"], figures["statistics_from"] = time.perf_counter() - t, source
    assert merged == n and source == "running sums", (merged, source)
    ours = yaml.safe_load((root / "normalization_stats.yaml").read_text())
    t = time.perf_counter()
    one_pass = normalization_stats(pool_rows(rows, "3d"))  # the full pass's arithmetic, on the same rows
    figures["pool_rows_s"] = time.perf_counter() - t
    figures["max_relative_difference"] = max(
        float(np.max(np.abs(np.subtract(ours[k], v)) / np.maximum(np.abs(v), 1e-300)))
        for k, v in one_pass.items()
        if isinstance(v, (list, float))
    )
    t = time.perf_counter()
    read = sum(1 for _ in outcomes.read(r, run_id))
    figures["outcomes_read_s"], figures["outcomes_read"] = time.perf_counter() - t, read
    # framefleet status during the run (the run's record and counters, no scan), with this Redis full.
    os.environ["REDIS_URL"] = url
    t = time.perf_counter()
    status.render(settings(), None)
    figures["status_s"] = time.perf_counter() - t
    figures["keys_in_redis"] = r.dbsize()
    if baseline:
        figures.update(sums_baseline(n, work, url, tiny, marker, summary))
    r.flushall()
    return figures


def sums_baseline(
    n: int, work: Path, url: str, tiny: Path, marker: dict[str, Any], summary: dict[str, Any]
) -> dict[str, Any]:
    """Before: each video's partial in the Redis hash and its outcome as JSON; the statistics by the full
    pass (HVALS, a stat per HDF5 file) over ``n`` replicated real videos."""
    import redis

    from tasks.run import completion
    from tasks.statistics import partials, stats_file

    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    big, entries, _summary = replicate(tiny, n, work)
    partials.file_path(big).unlink(missing_ok=True)
    shutil.rmtree(big / "markers" / partials.SEGMENTS, ignore_errors=True)
    base = r.info("memory")["used_memory"]
    fill_partials(r, big, [e["video_id"] for e in entries])
    pipe = r.pipeline(transaction=False)
    for i, e in enumerate(entries):
        outcome = realistic_outcome(marker, summary, e["video_id"], i)
        pipe.hset(completion.key("before", ":finished"), e["video_id"], json.dumps(outcome))
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    figures: dict[str, Any] = {"before_used_memory_run": r.info("memory")["used_memory"] - base}
    figures["before_partials_bytes"] = r.memory_usage(partials.redis_key(big), samples=0)
    figures["before_outcomes_bytes"] = r.memory_usage(completion.key("before", ":finished"), samples=0)
    t = time.perf_counter()
    figures["before_statistics_videos"] = stats_file.write_statistics(big, "3d", r)
    figures["before_statistics_s"] = time.perf_counter() - t
    r.flushall()
    return figures


def sharded_videos(n: int, work: Path) -> Path:
    """``n`` empty .mp4 files in 256 sub-folders (``s00/v0000000.mp4`` …), made once: the enqueuer only lists
    and stats them."""
    raw = work / f"sharded-{n}"
    if not (raw / ".complete").exists():
        shutil.rmtree(raw, ignore_errors=True)
        for shard in range(256):
            (raw / f"s{shard:02x}").mkdir(parents=True)
        for i in range(n):
            os.close(os.open(f"{raw}/s{i % 256:02x}/v{i:07d}.mp4", os.O_CREAT | os.O_WRONLY, 0o644))
        (raw / ".complete").touch()
    return raw


def finished_run(n: int, work: Path, tiny: Path) -> Path:
    """An output folder in which the ``n`` videos of ``sharded_videos(n)`` are complete, as a finished run leaves it.

    Each video has a sparse HDF5 file of the real file's size (no data blocks; its content is never read
    when its size and modification time are those recorded), the real marker of one video of ``tiny``
    in its shard, its entry in OUT/markers/partials.bin (the real partial), and a manifest entry with the
    status, quality and provenance a finished run records. A pristine copy of the manifest is kept
    beside it (``manifest.pristine``): every enqueue rewrites the manifest.
    """
    from tasks.outputs.stage_io import dataset_file
    from tasks.records import lineage, manifest
    from tasks.run.dataset import video_id_of
    from tasks.statistics import partials

    out = work / f"finished-{n}"
    if (out / ".complete").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)  # (its manifest: as this version writes it, with its roots in its head)
    out.mkdir(parents=True)
    vid = sorted(p.stem for p in tiny.glob("*.hdf5"))[0]
    h5, marker = dataset_file(tiny, vid)
    text, size = marker.read_text(), h5.stat().st_size
    stats = json.loads(text)["report"]["stats"]
    row = partials.encode(stats, "3d")
    mtime_ns = 1_700_000_000_000_000_000
    done = next(e for e in manifest.read(tiny)["videos"] if e["video_id"] == vid)  # with what its end recorded
    recorded = {k: done[k] for k in ("status", "quality", "provenance") if k in done}
    entries, kept = [], {}
    for i in range(n):
        path = sharded_path(i)
        name = video_id_of(path)
        with open(out / f"{name}.hdf5", "wb") as fh:
            fh.truncate(size)
        os.utime(out / f"{name}.hdf5", ns=(mtime_ns, mtime_ns))
        where = dataset_file(out, name)[1]
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(text)
        kept[name] = partials.HEADER.pack(size, mtime_ns, b"3d") + row
        entries.append({"video_id": name, "path": path, "bytes": 0, "text": "", "noun": "", **recorded})
    partials.save(out, kept)
    del kept
    entries.sort(key=manifest.sort_key)
    root = str(sharded_videos(n, work).resolve())
    head = {"dataset_root": root, "last_run": "bench", "order": manifest.ORDER, "roots": [root]}
    lineage.write(out, {**head, "provenance": []}, entries)
    shutil.copy2(out / "manifest.json", out / "manifest.pristine")
    (out / ".complete").touch()
    return out


def child_enqueue(code: Path, raw: Path, out: Path, url: str, window: int, resume: bool) -> dict[str, Any]:
    """``bench/enqueue_child.py`` over ``code``'s tree: its JSON, with what Redis holds after it."""
    import redis

    r = redis.Redis.from_url(url)
    r.flushall()
    base = r.info("memory")["used_memory"]
    cmd = [sys.executable, str(ROOT / "bench" / "enqueue_child.py"), "--code", str(code), str(raw), str(out)]
    cmd += ["--window", str(window)] + (["--resume"] if resume else [])
    done = subprocess.run(cmd, env={**os.environ, "REDIS_URL": url}, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"enqueue_child.py failed: {done.stdout[-2000:]} {done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    figures["redis_used_bytes"] = r.info("memory")["used_memory"] - base
    run_keys = list(r.scan_iter(match=f"ff:run:{figures['run_id']}:pending*"))
    figures["pending_bytes"] = sum(r.memory_usage(k, samples=0) or 0 for k in run_keys)
    figures["manifest_bytes"] = (out / "manifest.json").stat().st_size
    return figures


def stream_enqueue_phase(n: int, work: Path, url: str, codes: dict[str, Path], window: int) -> list[dict[str, Any]]:
    """Enqueue ``n`` sharded empty videos into a fresh output folder with each tree of ``codes``, no worker."""
    raw = sharded_videos(n, work)
    found = []
    for label, code in codes.items():
        out = work / f"enq-{label}-{n}"
        shutil.rmtree(out, ignore_errors=True)
        figures = child_enqueue(code, raw, out, url, window, resume=False)
        found.append({"code": label, "videos_listed": n, **figures})
        shutil.rmtree(out, ignore_errors=True)
    return found


def stream_continue_phase(n: int, work: Path, url: str, codes: dict[str, Path], tiny: Path) -> list[dict[str, Any]]:
    """``--continue`` over ``n`` complete videos (``finished_run``) with each tree of ``codes``, Redis flushed."""
    raw, out = sharded_videos(n, work), finished_run(n, work, tiny)
    found = []
    for label, code in codes.items():
        shutil.copy2(out / "manifest.pristine", out / "manifest.json")
        figures = child_enqueue(code, raw, out, url, 64, resume=True)
        found.append({"code": label, "videos_listed": n, **figures})
    return found


# The end of a run of N videos (issue 25): the statistics callback itself, in a process of its own per code
# tree (bench/callback_child.py), over an OUT of N complete videos (finished_run) and the Redis a run of N
# leaves at its end; then the callback of a --continue over them that made a few new videos.


def enqueued_manifest(out: Path) -> Path:
    """``out``'s manifest as an enqueue leaves it (no status, quality or provenance yet): ``manifest.enqueued``."""
    from tasks.records import manifest

    path = out / "manifest.enqueued"
    if not path.exists():
        shutil.copy2(out / "manifest.pristine", out / "manifest.json")
        top = manifest.head(out)
        with open(path.with_suffix(".tmp"), "w") as fh:
            fh.write(json.dumps(top)[:-1] + manifest.TAIL)
            for k, line in enumerate(manifest.lines(out)):
                entry = {
                    key: v for key, v in json.loads(line).items() if key not in ("status", "quality", "provenance")
                }
                fh.write((",\n" if k else "\n") + json.dumps(entry))
            fh.write("\n]}\n")
        path.with_suffix(".tmp").rename(path)
    return path


def reset_out(out: Path, manifest_copy: str) -> None:
    """Put ``out`` back as before any callback: its manifest ``manifest_copy``, no run files, no saved sums."""
    from tasks.statistics import partials, sums

    shutil.copy2(out / manifest_copy, out / "manifest.json")
    for gone in ("runs", "report"):
        shutil.rmtree(out / gone, ignore_errors=True)
    for name in ("run_summary.json", "normalization_stats.yaml", "report.html", "quarantine.jsonl"):
        (out / name).unlink(missing_ok=True)
    sums.file_path(out).unlink(missing_ok=True)
    shutil.rmtree(out / "markers" / partials.SEGMENTS, ignore_errors=True)


def fast_outcomes(r: Any, run_id: str, found: list[tuple[str, dict[str, Any]]], ttl_s: int) -> None:
    """The outcomes as tasks.records.outcomes.encode keeps them (deflated against the run's first one), written
    without encode's round trip per video; and the order hash the finishing tasks fill."""
    import hashlib
    import zlib

    from tasks.records import outcomes
    from tasks.run import completion

    zdict = outcomes.compact({k: v for k, v in found[0][1].items() if k != "video_id"})
    digest = hashlib.blake2b(zdict, digest_size=8).digest()
    r.hset(outcomes.dict_key(run_id), digest, zdict)
    finished, order = completion.key(run_id, ":finished"), completion.key(run_id, ":order")
    pipe = r.pipeline(transaction=False)
    for k, (vid, outcome) in enumerate(found):
        packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
        plain = outcomes.compact({key: v for key, v in outcome.items() if key != "video_id"})
        pipe.hset(finished, vid, outcomes.PACKED + digest + packer.compress(plain) + packer.flush())
        pipe.hset(order, vid, k + 1)
        if k % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    for key in (finished, order, outcomes.dict_key(run_id)):
        r.expire(key, ttl_s)


def layout_of(code: Path) -> str:
    """Where the tree ``code`` keeps a live run's outcomes: "files" (OUT/runs/<run>.outcomes.live/ and the
    run's counters in Redis, tasks.records.outcome_files, lines of JSON), "files-tab" (the same, lines of an id,
    a tab and the fields: trees before JSON Lines, which read only those) or "redis" (each outcome in Redis,
    as main did)."""
    index = code / "tasks" / "records" / "outcome_index.py"
    if index.exists() and "HEAD = " in index.read_text():
        return "files"
    return "files-tab" if index.exists() or (code / "tasks" / "run" / "outcome_files.py").exists() else "redis"


SEGMENTS = 16  # worker processes whose segments hold a "files" run's lines


def counted_outcomes(
    r: Any, run_id: str, found: list[tuple[str, dict[str, Any]]], ttl_s: int, lines: Path, tab: bool = False
) -> None:
    """Each video counted as its finishing task counts it (tasks.run.completion's own Lua, with its counters),
    and its line in one of SEGMENTS segments under ``lines`` (written whole, not a line at a time; ``tab``: in
    the earlier form, bench.simulated.earlier_line), with the segment's index rows (tasks.records.outcome_index)."""
    from tasks.celery_app import settings
    from tasks.records import outcome_files, outcome_index
    from tasks.run import completion, runs, tally
    from tasks.statistics import sums

    shutil.rmtree(lines, ignore_errors=True)
    lines.mkdir(parents=True)
    stages, shards = settings().enabled_stages(), sums.shards_of(runs.lookup(r, run_id))
    script = r.register_script(completion._RECORD)
    texts: list[list[str]] = [[] for _ in range(SEGMENTS)]
    pipe = r.pipeline(transaction=False)
    for k, (_vid, outcome) in enumerate(found):
        texts[k % SEGMENTS].append((earlier_line if tab else outcome_files.line_of)(*tally.classify(run_id, outcome)))
        names, args = completion.record_call(run_id, outcome, stages, shards, ttl_s)
        script(keys=names, args=args, client=pipe)
        if k % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    for i, text in enumerate(texts):
        (lines / f"bench-{i}-0000{i:04x}.jsonl").write_text("".join(text))
        (lines / f"bench-{i}-0000{i:04x}{outcome_index.INDEX}").write_text(outcome_index.index_of(text))


def run_redis(
    r: Any, run: dict[str, Any], ids: list[str], tiny: Path, rows: np.ndarray, first: int, lines: Path | None = None
) -> None:
    """What a run of ``ids`` leaves in Redis when its last video finishes: its record, its running sums (with
    the digest) and merged marks, each video's outcome and order (``lines``: the run's counters, and each
    video's line written there, as this tree's finishing tasks leave them), and its stage log (as kept)."""
    from tasks.observe.metrics import STAGE_LOG_KEPT, stage_log_key
    from tasks.outputs.stage_io import dataset_file
    from tasks.run import runs
    from tasks.statistics import sums
    from tasks.statistics.stats import pool_rows, to_row

    vid0 = sorted(p.stem for p in tiny.glob("*.hdf5"))[0]
    marker = json.loads(dataset_file(tiny, vid0)[1].read_text())
    summary = json.loads((tiny / "run_summary.json").read_text())
    run_id, n, ttl = run["run_id"], len(ids), 3600
    runs.publish(r, {**run, "callback_id": "bench"}, ttl)
    total = pool_rows(rows, "3d")
    fields: dict[str, Any] = {"row:3d": to_row(total.to_dict(), "3d").astype("<f8").tobytes(), "videos:3d": n}
    fields.update({f"digest:{i}": d for i, d in enumerate(sums.digest_of(ids))})
    r.hset(sums.sums_key(run_id), mapping=fields)
    shards = sums.shard_count(n)
    pipe = r.pipeline(transaction=False)
    for k, vid in enumerate(ids):
        mark = sums.mark_of(vid)
        pipe.hset(sums.shard_key(run_id, mark, shards), mark, b"s" * 16)
        if k % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    found = [(vid, realistic_outcome(marker, summary, vid, first + k)) for k, vid in enumerate(ids)]
    if lines is None:
        fast_outcomes(r, run_id, found, ttl)
    else:
        counted_outcomes(r, run_id, found, ttl, lines, tab=lines.parent.name.endswith("-tab"))
    del found
    stages, now = list(summary["stages"]), time.time()
    pipe = r.pipeline(transaction=False)
    for i in range(min(STAGE_LOG_KEPT, 5 * n)):
        span = {"gpu": 0, "ok": True, "skipped": False, "worker": "gpu0@bench", "run_s": 0.5}
        span.update(video=ids[i // len(stages)], stage=stages[i % len(stages)], start=now + i, end=now + i + 1)
        pipe.rpush(stage_log_key(run_id), json.dumps(span))
    pipe.execute()


def snapshot(r: Any) -> dict[bytes, bytes]:
    return {k: r.dump(k) for k in r.scan_iter(count=5000)}


def restore(r: Any, saved: dict[bytes, bytes]) -> None:
    r.flushall()
    pipe = r.pipeline(transaction=False)
    for k, (key, value) in enumerate(saved.items()):
        pipe.restore(key, 0, value)
        if k % 2000 == 1999:
            pipe.execute()
    pipe.execute()


def an_hour_later(r: Any) -> int:
    """Redis's used memory once every key an hour would have expired is gone (those keys deleted now)."""
    for key in list(r.scan_iter(count=5000)):
        if 0 <= r.ttl(key) <= 3600:
            r.delete(key)
    return int(r.info("memory")["used_memory"])


def child_callback(code: Path, run: dict[str, Any], url: str) -> dict[str, Any]:
    import redis

    r = redis.Redis.from_url(url)
    before = r.info("memory")["used_memory"]
    cmd = [sys.executable, str(ROOT / "bench" / "callback_child.py"), "--code", str(code), json.dumps(run)]
    done = subprocess.run(cmd, env={**os.environ, "REDIS_URL": url}, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"callback_child.py failed: {done.stdout[-2000:]} {done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    figures.update(redis_before=before, redis_after=r.info("memory")["used_memory"], redis_hour_after=an_hour_later(r))
    return figures


def add_new_videos(out: Path, ids: list[str], tiny: Path, rows: np.ndarray) -> None:
    """``ids`` complete in ``out`` as a --continue's workers leave them: a file, its marker, its entry in a
    segment of OUT/markers/partials/."""
    from tasks.outputs.stage_io import dataset_file
    from tasks.statistics import partials

    vid0 = sorted(p.stem for p in tiny.glob("*.hdf5"))[0]
    text = dataset_file(tiny, vid0)[1].read_text()
    for vid, row in zip(ids, rows, strict=True):
        (out / f"{vid}.hdf5").write_bytes(b"\0" * 1000)
        where = dataset_file(out, vid)[1]
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(text)
        st = (out / f"{vid}.hdf5").stat()
        partials.append(out, vid, partials.HEADER.pack(st.st_size, st.st_mtime_ns, b"3d") + row.astype("<f8").tobytes())


def remove_new_videos(out: Path, ids: list[str]) -> None:
    from tasks.outputs.stage_io import dataset_file

    for vid in ids:
        (out / f"{vid}.hdf5").unlink(missing_ok=True)
        dataset_file(out, vid)[1].unlink(missing_ok=True)


def summary_differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The keys of two run summaries whose values differ (floats by more than 1e-6 s or 1e-7 relative: main's
    stage spans were float64 differences of epoch seconds, each off by up to 2.4e-7 s, where whole milliseconds
    are now exact), with both values; when and how long the end took aside."""

    def near(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, (int, float)):
            return abs(x - y) <= max(1e-6, 1e-7 * abs(x))
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(near(x[k], y[k]) for k in x)
        if isinstance(x, list) and isinstance(y, list):
            return len(x) == len(y) and all(near(u, v) for u, v in zip(x, y, strict=True))
        return bool(x == y)

    volatile = {"finished", "wall_s"}
    return {
        k: [str(a.get(k))[:300], str(b.get(k))[:300]]
        for k in sorted(set(a) | set(b))
        if k not in volatile and not near(a.get(k), b.get(k))
    }


def end_run_phase(n: int, work: Path, url: str, codes: dict[str, Path], tiny: Path, new: int) -> list[dict[str, Any]]:
    """The callback at the end of a run of ``n`` videos, then that of a --continue over them that made ``new``."""
    import redis

    from tasks.outputs.stage_io import dataset_file
    from tasks.run.dataset import video_id_of
    from tasks.statistics import partials

    r = redis.Redis.from_url(url, socket_timeout=600)  # a DUMP of main's outcomes hash at a million takes seconds
    out = finished_run(n, work, tiny)
    enqueued_manifest(out)
    ids = [video_id_of(sharded_path(i)) for i in range(n)]
    vid0 = sorted(p.stem for p in tiny.glob("*.hdf5"))[0]
    marker = json.loads(dataset_file(tiny, vid0)[1].read_text())
    row = partials.encode(marker["report"]["stats"], "3d")
    rows = np.frombuffer(row, dtype="<f8").reshape(1, -1).repeat(n, axis=0)  # partials.bin's rows: one real row
    started = time.time()
    end = {"run_id": f"end-{n}", "output_root": str(out), "started": started, "videos": n, "already_complete": 0}
    new_ids = [video_id_of(f"new/v{i:03d}.mp4") for i in range(new)]
    new_rows = realistic_partials(marker, new, seed=7)
    more = {"run_id": f"more-{n}", "output_root": str(out), "started": started, "videos": new, "already_complete": n}
    at_end, at_more, made_s = {}, {}, {}
    for layout in sorted({layout_of(code) for code in codes.values()}):
        lines = work / f"lines-{layout}" if layout.startswith("files") else None
        r.flushall()
        t = time.perf_counter()
        run_redis(r, end, ids, tiny, rows, 0, lines and lines / "end")
        made_s[layout] = time.perf_counter() - t
        at_end[layout] = snapshot(r)
        r.flushall()
        run_redis(r, more, new_ids, tiny, new_rows, n, lines and lines / "more")
        at_more[layout] = snapshot(r)

    def live_lines(layout: str, run: dict[str, Any], name: str) -> None:
        """A "files" run's live outcomes folder, as its finishing tasks left it."""
        if layout.startswith("files"):
            from tasks.records import outcome_files

            shutil.copytree(work / f"lines-{layout}" / name, outcome_files.live_dir(out, run["run_id"]))

    found: list[dict[str, Any]] = []
    summaries: dict[str, dict[str, Any]] = {}
    for label, code in codes.items():
        layout = layout_of(code)
        reset_out(out, "manifest.enqueued")
        restore(r, at_end[layout])
        live_lines(layout, end, "end")
        try:
            figures = {"code": label, "phase": "end", "videos": n, "redis_fill_s": made_s[layout], "layout": layout}
            figures.update(child_callback(code, end, url))
        except RuntimeError as exc:  # recorded: a baseline killed for memory is a result too
            found.append({**figures, "error": str(exc)[-1500:]})
            print(f"end of a run of {n} ({label}) failed: {exc}", flush=True)
            continue
        figures["manifest_bytes"] = (out / "manifest.json").stat().st_size
        summaries[label] = json.loads((out / "run_summary.json").read_text())
        figures["outcomes_file_bytes"] = sum(f.stat().st_size for f in (out / "runs").glob("*.outcomes*/*.jsonl"))
        figures["outcomes_file_bytes"] += sum(f.stat().st_size for f in (out / "runs").glob("*.outcomes.jsonl"))
        found.append(figures)
        print(f"end of a run of {n} ({label}): {json.dumps(figures)}", flush=True)
        # A --continue over them that made ``new`` videos; the manifest as the earlier end left it (recorded).
        saved = (out / "markers" / "sums.json").read_bytes() if (out / "markers" / "sums.json").exists() else None
        reset_out(out, "manifest.pristine")
        if saved is not None:
            (out / "markers" / "sums.json").write_bytes(saved)
        add_new_videos(out, new_ids, tiny, new_rows)
        restore(r, at_more[layout])
        live_lines(layout, more, "more")
        figures = {"code": label, "phase": "continue", "videos": n, "new": new, **child_callback(code, more, url)}
        figures["statistics_from"] = json.loads((out / "run_summary.json").read_text()).get("statistics_from")
        figures["stats"] = yaml.safe_load((out / "normalization_stats.yaml").read_text())
        found.append(figures)
        print(f"--continue over {n} + {new} new ({label}): {json.dumps(figures)}", flush=True)
        remove_new_videos(out, new_ids)
    reset_out(out, "manifest.pristine")
    if len(summaries) >= 2:  # the end's summary of each tree: what differs, times aside
        found[0]["summary_differences"] = summary_differences(*list(summaries.values())[:2])
    both = [f["stats"] for f in found if f["phase"] == "continue"][1::-1]  # before's, then now's
    for f in found:
        f.pop("stats", None)
    if len(both) == 2:  # the saved sums plus the run's against the full pass
        found[-1]["continue_max_relative_difference"] = max(
            float(np.max(np.abs(np.subtract(both[1][k], v)) / np.maximum(np.abs(v), 1e-300)))
            for k, v in both[0].items()
            if isinstance(v, (list, float))
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", default="10000,50000", help="complete videos for the callback and --continue")
    parser.add_argument("--enqueue-videos", default="1000,2000,10000,50000", help="videos to enqueue now")
    parser.add_argument("--chord-videos", default="1000,2000", help="videos to enqueue as one chord (before)")
    parser.add_argument("--window", type=int, default=64, help="videos in flight when enqueued now")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-scale"))
    parser.add_argument("--end-videos", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--skip",
        default="",
        help="phases to skip: enqueue,end,callback,continue,sums (with --stream-videos: enqueue,continue)",
    )
    parser.add_argument("--sums-videos", default="10000,100000,1000000", help="videos of a run for the sums phase")
    parser.add_argument("--sums-baseline", default="10000,100000", help="of those, the ones also measured as before")
    parser.add_argument(
        "--stream-videos", default="", help="videos for the streaming enqueue and --continue curves, e.g. 10000,100000"
    )
    parser.add_argument("--baseline-code", type=Path, help="a tree of the code to compare with (git archive COMMIT)")
    parser.add_argument("--baseline-videos", default="10000,100000", help="the sizes also run with --baseline-code")
    parser.add_argument("--live-videos", default="", help="videos of a simulated live run, e.g. 10000,100000,1000000")
    parser.add_argument("--live-small", type=int, default=1000, help="the live run status and Flower are compared on")
    parser.add_argument("--no-flower", action="store_true", help="with --live-videos: leave Flower's API out")
    parser.add_argument(
        "--end-run-videos", default="", help="videos for the end-of-run callback curve (and a --continue's), e.g. 10000"
    )
    parser.add_argument("--new-videos", type=int, default=5, help="videos a --continue makes in the end-run curve")
    parser.add_argument(
        "--end-run-abba",
        action="store_true",
        help="with --baseline-code: the ends in the order now, before, before, now (one Redis fill)",
    )
    args = parser.parse_args(argv)
    if args.end_run_videos:
        return end_run_main(args)
    if args.stream_videos:
        return stream_main(args)
    if args.live_videos:
        return live_main(args)
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
        if "sums" not in skip:
            results["sums"] = []
            for n in [int(v) for v in args.sums_videos.split(",") if v]:
                c = sums_phase(n, args.work, url, out, str(n) in args.sums_baseline.split(","))
                results["sums"].append(c)
                print(f"sums over {n} videos: {json.dumps(c, default=str)}", flush=True)
    results["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


def tiny_run(work: Path) -> Path:
    """A small finished run (three tiny videos) whose marker, report and summary the simulated videos copy;
    made once per work folder. Needs REDIS_URL set to a private Redis."""
    tiny = work / "tiny-out"
    if not (tiny / "run_summary.json").exists():
        end_state(3, work)
    return tiny


def end_run_main(args: argparse.Namespace) -> int:
    """The curve of the run's end over 10k … 1M videos, and a --continue's, now and (``--baseline-code``) before."""
    results: dict[str, Any] = {"load_before": os.getloadavg(), "end_run": []}
    args.work.mkdir(parents=True, exist_ok=True)
    with private_redis() as url:
        os.environ["REDIS_URL"] = url
        tiny = tiny_run(args.work)
        for n in (int(v) for v in args.end_run_videos.split(",")):
            codes = {"now": ROOT}  # first: the baseline may run out of memory at a million
            if args.baseline_code and str(n) in args.baseline_videos.split(","):
                codes["before"] = args.baseline_code
                if args.end_run_abba:  # each tree first once: the first end after the fill meets colder caches
                    codes = {"now": ROOT, "before": args.baseline_code, "before 2": args.baseline_code, "now 2": ROOT}
            results["end_run"] += end_run_phase(n, args.work, url, codes, tiny, args.new_videos)
            results[f"load_after_{n}"] = os.getloadavg()
            if args.json:
                args.json.write_text(json.dumps(results, indent=1, default=str))
    results["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


def stream_main(args: argparse.Namespace) -> int:
    """The curves of issue 25's items 2 and 3: enqueue and --continue over 10k … 1M videos, now and before."""
    results: dict[str, Any] = {"load_before": os.getloadavg(), "enqueue": [], "continue": []}
    skip = set(args.skip.split(","))
    args.work.mkdir(parents=True, exist_ok=True)
    with private_redis() as url:
        os.environ["REDIS_URL"] = url
        tiny = tiny_run(args.work) if "continue" not in skip else args.work / "tiny-out"
        for n in (int(v) for v in args.stream_videos.split(",")):
            codes = {"now": ROOT}
            if args.baseline_code and str(n) in args.baseline_videos.split(","):
                codes = {"before": args.baseline_code, **codes}
            if "enqueue" not in skip:
                for e in stream_enqueue_phase(n, args.work, url, codes, args.window):
                    results["enqueue"].append(e)
                    print(
                        f"enqueue {n} ({e['code']}): first chain sent {e['first_sent_s']:.2f} s, every video sent "
                        f"or held {e['all_recorded_s']:.2f} s ({e['cpu_s']:.2f} CPU s); "
                        f"peak RSS {e['peak_rss_mib']:.0f} MiB "
                        f"({e['rss_before_mib']:.0f} before); Redis +{e['redis_used_bytes'] / 2**20:.1f} MiB, "
                        f"pending {e['pending_bytes'] / 2**20:.2f} MiB "
                        f"({e['pending_bytes'] / max(1, n - args.window):.1f} B per held video); "
                        f"manifest {e['manifest_bytes'] / 2**20:.1f} MiB",
                        flush=True,
                    )
            if "continue" not in skip:
                for c in stream_continue_phase(n, args.work, url, codes, tiny):
                    results["continue"].append(c)
                    print(
                        f"--continue over {n} complete ({c['code']}): {c['all_recorded_s']:.2f} s "
                        f"({c['cpu_s']:.2f} CPU s), "
                        f"{c['already_complete']} complete, {c['videos']} sent; peak RSS {c['peak_rss_mib']:.0f} MiB "
                        f"({c['rss_before_mib']:.0f} before); manifest {c['manifest_bytes'] / 2**20:.1f} MiB",
                        flush=True,
                    )
    results["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


def live_main(args: argparse.Namespace) -> int:
    """Issue 25's live-run curve: Redis per structure over 10k … 1M videos, now and with main's claims, and
    status and Flower beside the largest run."""
    from bench import live_run

    results: dict[str, Any] = {"load_before": os.getloadavg(), "live": [], "responsive": {}}
    args.work.mkdir(parents=True, exist_ok=True)
    with private_redis() as url:
        os.environ["REDIS_URL"] = url
        tiny = tiny_run(args.work)
        sizes = [int(v) for v in args.live_videos.split(",")]
        small = live_run.live_run(args.live_small, url, tiny, keep=True)
        results["responsive"][args.live_small] = live_run.responsiveness(url, small["run_id"], not args.no_flower)
        print(f"beside a live run of {args.live_small}: {json.dumps(results['responsive'][args.live_small])}")
        for n in sizes:
            found = live_run.live_run(n, url, tiny, keep=n == max(sizes))
            results["live"].append(found)
            print(
                f"live run of {n}: enqueued {found['enqueued_bytes'] / 1e6:.1f} MB, last window "
                f"{found['last_window_now_bytes'] / 1e6:.1f} MB now, {found['last_window_main_bytes'] / 1e6:.1f} MB "
                f"with main's claims; {json.dumps(found)}",
                flush=True,
            )
        big = results["live"][-1]
        results["responsive"][big["videos"]] = live_run.responsiveness(url, big["run_id"], not args.no_flower)
        print(f"beside a live run of {big['videos']}: {json.dumps(results['responsive'][big['videos']])}")
        import redis

        from tasks.statistics.sums import MAX_SHARDS

        big["let_go_s"] = live_run.let_go_s(redis.Redis.from_url(url, socket_timeout=600), big["run_id"], MAX_SHARDS)
        print(f"its end in Redis (completion.let_go): {big['let_go_s']:.2f} s", flush=True)
    results["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

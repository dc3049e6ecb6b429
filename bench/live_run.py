"""What a live run of N videos holds in Redis, every structure together, and whether status and Flower stay
responsive beside it (issue 25, items 1 and 4). Called by ``bench/scale.py --live-videos 10000,100000,1000000``.

The run is simulated on a private redis-server with the keys and the writes of the real code: its record
(``shards`` as a plain enqueue fixes it, the size unknown: 65,536), then two moments:

- **enqueued**: N − window videos held (tasks.run.pending.Holder), the window's jobs in the sent hash;
- **last window**: N − window videos finished, each counted with its place and what it adds to the run's
  counters (completion's own Lua; its outcome's line goes to OUT, not Redis),
  its partial merged (tasks.statistics.sums), its five stage tasks marked done (tasks.delivery.claims' writes at a
  task's end, by marks.of) and logged (the stage log, newest 100,000), the pending chunks gone and the
  bitmap full; the window in flight: its jobs sent, one start counted each.

Video ids are those of ``s<xx>/v<i>.mp4`` (tasks.run.dataset.video_id_of), task ids uuid4 as Celery makes
them. ``used_memory`` is read after each structure is added. The order (video → its place) and the done
marks and start counts are also written as main keeps them (one hash of video id → place; one hash of task
id → 1 and one of task id → starts, a field per stage task for the whole run) and the outcomes as main keeps
them (each deflated against the run's dictionary, a field per video), in the same Redis, and removed again,
for the baseline.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 64
BATCH = 2000


def _used(r: Any) -> int:
    return int(r.info("memory")["used_memory"])


def _task_ids(rng: random.Random, count: int) -> list[str]:
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


def live_run(n: int, url: str, tiny: Path, keep: bool = False, main_layout: bool = True) -> dict[str, Any]:
    """The Redis memory of a live run of ``n`` videos at its two moments, per structure, now and with main's
    done marks and start counts. With ``keep`` the run stays in Redis (now's layout) for the timings; without
    ``main_layout`` main's order, marks and counts are not written (their figures are 0)."""
    if n <= WINDOW:
        raise SystemExit(
            f"a live run is measured at its last window of {WINDOW} videos: give more than {WINDOW}, not {n}"
        )
    import redis

    from bench.simulated import realistic_outcome, realistic_partials, sharded_path
    from tasks import keys
    from tasks.celery_app import settings
    from tasks.delivery import marks
    from tasks.job import Job
    from tasks.observe import metrics
    from tasks.outputs.stage_io import dataset_file
    from tasks.records import outcomes
    from tasks.run import completion, pending, runs
    from tasks.run.dataset import new_run_id, video_id_of
    from tasks.statistics import partials, sums

    stages = settings().enabled_stages()  # a video's chain: one stage task each
    r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=600)  # main's DEL of its hashes takes s
    r.flushall()
    vid0 = sorted(p.stem for p in tiny.glob("*.hdf5"))[0]
    h5, marker_path = dataset_file(tiny, vid0)
    marker = json.loads(marker_path.read_text())
    summary = json.loads((tiny / "run_summary.json").read_text())
    run_id, out = new_run_id(), "/data/datasets/egocentric-hands/out"
    ids = [video_id_of(sharded_path(i)) for i in range(n)]
    figures: dict[str, Any] = {"videos": n, "run_id": run_id, "window": WINDOW}
    mem = {"base": _used(r)}

    def step(name: str) -> None:
        mem[name] = _used(r)

    record = {
        "run_id": run_id,
        "videos": None,
        "already_complete": None,
        "gpus": None,
        "started": time.time(),
        "raw_dir": "/data/datasets/egocentric-hands/raw",
        "output_root": out,
        "intermediates": "keep",
        "window": WINDOW,
        "status": "running",
        "shards": sums.MAX_SHARDS,
        "callback_id": str(uuid.uuid4()),
    }
    runs.publish(r, record, 3600)
    job0 = Job(run_id, ids[0], sharded_path(0), record["raw_dir"], out, chain=stages)

    def job_of(i: int) -> Job:
        return dataclasses.replace(job0, video_id=ids[i], video=sharded_path(i))

    step("record")
    t = time.perf_counter()
    holder = pending.Holder(r, run_id, pending.shared_part(job0), 3600, send=lambda i: None)
    for i in range(WINDOW, n):
        holder.add_part([ids[i], sharded_path(i)])
    holder.close()
    completion.note_sent(r, [job_of(i) for i in range(WINDOW)], 3600)
    figures["enqueue_s"] = time.perf_counter() - t
    step("enqueued")

    # The last window: every video but WINDOW finished, in a random order.
    order = np.random.default_rng(1).permutation(n)
    finished, in_flight = order[: n - WINDOW], order[n - WINDOW :]
    r.delete(pending.hash_key(run_id))  # each chunk goes once all its videos are sent
    r.setrange(pending.bits_key(run_id), 0, b"\xff" * ((n - WINDOW + 7) // 8))
    r.delete(completion.sent_key(run_id))
    completion.note_sent(r, [job_of(int(i)) for i in in_flight], 3600)
    step("pending_sent")
    finished_key = completion.key(run_id, ":finished")
    run_key = runs.redis_key(run_id)
    # The order first, as main kept it (one hash of video ids) for the baseline, then as now: the places the
    # recording Lua below finds there and keeps (the same writes as its own HSET, measured alone).
    pipe = r.pipeline(transaction=False)
    for at in range(0, len(finished) if main_layout else 0, 1000):
        places = {ids[i]: at + j + 1 for j, i in enumerate(finished[at : at + 1000])}
        pipe.hset(completion.key(run_id, ":order"), mapping=places)
        if at % (20 * 1000) == 0:
            pipe.execute()
    pipe.execute()
    step("main_order")
    r.delete(completion.key(run_id, ":order"))
    step("main_order_gone")
    # Main's outcomes (each deflated in one hash, tasks.records.outcomes), measured and deleted; then each video
    # counted as now by completion's own Lua: its place in the order, what it adds to the run's counters.
    pipe = r.pipeline(transaction=False)
    for k, i in enumerate(finished):
        pipe.hset(
            finished_key, ids[i], outcomes.encode(r, run_id, realistic_outcome(marker, summary, ids[i], int(i)), 3600)
        )
        if k % BATCH == BATCH - 1:
            pipe.execute()
    pipe.execute()
    step("main_outcomes")
    r.delete(finished_key, outcomes.dict_key(run_id))
    step("main_outcomes_gone")
    record_script = r.register_script(completion._RECORD)
    t = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for k, i in enumerate(finished):
        outcome = realistic_outcome(marker, summary, ids[i], int(i))
        names, args = completion.record_call(run_id, outcome, stages, record["shards"], 3600)
        record_script(keys=names, args=args, client=pipe)
        if k % BATCH == BATCH - 1:
            pipe.execute()
    pipe.execute()
    figures["outcomes_s"] = time.perf_counter() - t
    tally_keys = [completion.key(run_id, s) for s in (keys.RUN_TALLY_SUFFIX, keys.RUN_FAILED_SUFFIX)]
    figures["tally_fields"] = r.hlen(tally_keys[0])
    tally_bytes = sum(r.memory_usage(k) or 0 for k in tally_keys)
    step("counted")
    rows = realistic_partials(marker, n)
    header = partials.HEADER.pack(h5.stat().st_size, h5.stat().st_mtime_ns, b"3d")
    script = sums.merge_script()
    t = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for k, i in enumerate(finished):
        entry = header + rows[i].astype("<f8").tobytes()
        script(*sums.merge_call(run_id, record["shards"], ids[i], entry, 3600), client=pipe)
        if k % BATCH == BATCH - 1:
            pipe.execute()
    pipe.execute()
    figures["merge_s"] = time.perf_counter() - t
    step("sums")
    pipe = r.pipeline(transaction=False)
    entries = 0
    for i in finished[-metrics.STAGE_LOG_KEPT // len(stages) :]:
        timings = realistic_outcome(marker, summary, ids[i], int(i))["timings"]
        for stage in stages:
            timing = timings.get(stage) or next(iter(timings.values()))
            entry = {"video": ids[i], "stage": stage, "gpu": 0, "ok": True, **timing}
            pipe.rpush(metrics.stage_log_key(run_id), json.dumps(entry, separators=(",", ":")))
            entries += 1
        if entries % BATCH < len(stages):
            pipe.execute()
    pipe.execute()
    figures["stage_log_entries"] = entries
    step("stage_log")
    for stage in stages:
        r.hincrby(run_key, f"{stage}.done", n - WINDOW)
    step("counters")

    def now_layout(seed: int) -> None:
        rng = random.Random(seed)
        for start in range(0, len(finished), 20_000):
            tasks = _task_ids(rng, len(stages) * len(finished[start : start + 20_000]))
            grouped: dict[str, list[int]] = {}
            for task_id in tasks:
                where = marks.of(run_id, task_id, record["shards"])
                grouped.setdefault(where.done_key, []).append(where.mark)
            pipe = r.pipeline(transaction=False)
            for key, found in grouped.items():
                pipe.sadd(key, *found)  # the SADD of each task's end (tasks.delivery.claims.finish), together
                pipe.expire(key, 3600)
            pipe.execute()
        pipe = r.pipeline(transaction=False)
        for task_id in _task_ids(rng, WINDOW):  # the window's tasks running: one start each
            pipe.hincrby(marks.attempts_key(run_id), task_id, 1)
        pipe.expire(marks.attempts_key(run_id), 3600)
        pipe.execute()

    def main_marks(seed: int) -> None:
        rng = random.Random(seed)
        done, attempts = f"ff:run:{run_id}:done", marks.attempts_key(run_id)
        for start in range(0, len(finished), 20_000):
            tasks = _task_ids(rng, len(stages) * len(finished[start : start + 20_000]))
            pipe = r.pipeline(transaction=False)
            for at in range(0, len(tasks), 1000):
                pipe.hset(done, mapping=dict.fromkeys(tasks[at : at + 1000], 1))  # every task's end
                pipe.hset(attempts, mapping=dict.fromkeys(tasks[at : at + 1000], 1))  # every start, kept
            pipe.execute()
        pipe = r.pipeline(transaction=False)
        for task_id in _task_ids(rng, WINDOW):
            pipe.hincrby(attempts, task_id, 1)
        pipe.execute()

    t = time.perf_counter()
    if main_layout:
        main_marks(2)
    figures["main_marks_s"] = time.perf_counter() - t
    step("main_marks")
    t = time.perf_counter()
    r.delete(f"ff:run:{run_id}:done", marks.attempts_key(run_id))  # main's end of the run: Redis blocked meanwhile
    figures["main_marks_delete_s"] = time.perf_counter() - t
    step("main_marks_gone")
    t = time.perf_counter()
    now_layout(2)
    figures["now_marks_s"] = time.perf_counter() - t
    step("now_marks")
    written = [k for k in marks.done_keys(run_id, record["shards"]) if r.exists(k)]
    figures["done_keys"] = len(written)
    sizes = [r.scard(k) for k in written]
    figures["done_per_key"] = {"mean": statistics.mean(sizes), "max": max(sizes)}
    figures["done_not_intset"] = sum(r.object("encoding", k) != "intset" for k in written)
    figures["keys_in_redis"] = r.dbsize()
    b = mem
    figures["bytes"] = {
        "record": b["record"] - b["base"],
        "pending (enqueued)": b["enqueued"] - b["record"],
        "pending bitmap and sent (last window)": b["pending_sent"] - b["record"],
        "order, main": b["main_order"] - b["pending_sent"],
        "order, now": b["counted"] - b["main_outcomes_gone"] - tally_bytes,
        "outcomes, main": b["main_outcomes"] - b["main_order_gone"],
        "the run's counters and failures, now": tally_bytes,
        "sums and merged marks": b["sums"] - b["counted"],
        "stage log": b["stage_log"] - b["sums"],
        "counters": b["counters"] - b["stage_log"],
        "done marks and starts, main": b["main_marks"] - b["counters"],
        "done marks and starts, now": b["now_marks"] - b["main_marks_gone"],
    }
    parts = figures["bytes"]
    # All but the order, the outcomes (now: the counters) and the claims.
    common = b["counters"] - b["base"] - (b["counted"] - b["main_outcomes_gone"])
    figures["enqueued_bytes"] = b["enqueued"] - b["base"]
    now_parts = ("order, now", "the run's counters and failures, now", "done marks and starts, now")
    main_parts = ("order, main", "outcomes, main", "done marks and starts, main")
    figures["last_window_now_bytes"] = common + sum(parts[k] for k in now_parts)
    figures["last_window_main_bytes"] = common + sum(parts[k] for k in main_parts)
    if not keep:
        figures["let_go_s"] = let_go_s(r, run_id, record["shards"])
        r.flushall()
    return figures


def let_go_s(r: Any, run_id: str, shards: int) -> float:
    """Seconds of the run's end in Redis (tasks.run.completion.let_go: its per-video keys deleted by name)."""
    from tasks.run import completion

    t = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    completion.let_go(pipe, run_id, 600, shards=shards)
    pipe.execute()
    return time.perf_counter() - t


def timed(fn: Any, repeat: int) -> dict[str, float]:
    took = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t)
    return {"median_s": statistics.median(took), "max_s": max(took)}


def responsiveness(url: str, run_id: str, flower: bool = True) -> dict[str, Any]:
    """``framefleet status`` (the command, and its rendering in-process), the sweep's and cancel's reads of
    the queues and runs, and real Flower's HTTP API, against the Redis at ``url`` as it is."""
    import redis

    from tasks.celery_app import settings
    from tasks.cli import status
    from tasks.observe import stall
    from tasks.run import runs, sweep

    conf = settings()
    r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=600)
    found: dict[str, Any] = {"keys_in_redis": r.dbsize()}
    chosen = runs.lookup(r, run_id)
    found["status_render"] = timed(lambda: status.render(conf, None, chosen), 5)
    env = {**os.environ, "REDIS_URL": url}
    command = [str(Path(sys.executable).parent / "framefleet"), "status", run_id]
    found["status_command"] = timed(lambda: subprocess.run(command, env=env, check=True, capture_output=True), 3)
    found["python_start"] = timed(
        lambda: subprocess.run([*command[:1], "--help"], env=env, check=True, capture_output=True), 3
    )
    found["sweep_active_runs"] = timed(lambda: sweep.active_runs(r), 3)
    found["queue_names"] = timed(lambda: stall.queue_names(r, r, conf), 3)
    if flower:
        found["flower"] = flower_api(url)
    return found


def flower_api(url: str) -> dict[str, Any]:
    """Seconds per request of real Flower's HTTP API (``celery -A tasks flower``) on this Redis, no worker."""
    from tasks.redis_client import free_port

    port, auth = free_port(), f"bench:{uuid.uuid4().hex}"
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"flower-{port}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": url, "FLOWER_BASIC_AUTH": auth},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def get(path: str) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return int(response.status)

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get("/healthcheck")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"Flower did not start; see {log.name}") from None
                time.sleep(0.2)
        paths = ["/healthcheck", "/api/workers", "/api/tasks?limit=100", "/api/queues/length", "/workers", "/broker"]
        return {path: timed(lambda p=path: get(p), 5) for path in paths}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
        log.close()

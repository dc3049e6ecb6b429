"""Prometheus metrics, read at scrape time, and the hook that records every finished stage task.

``record_stage`` (called by each stage task) keeps cumulative counters and a duration histogram
in Redis, shared by every worker of every host, and appends the task to its run's stage log
``ff:run:<id>:stages`` that the run report and status read (OUT/runs/<id>.stages.jsonl once the
run has ended). ``start_exporter`` serves ``/metrics``: GPUs (the probe),
the worker registry, queue depths, those counters and the autoscaler's decisions (``ff:autoscale``).
Nothing here touches CUDA; prometheus_client is imported only by the exporter.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tasks import keys
from tasks.delivery import settings_queues
from tasks.delivery.queues import lengths as queue_lengths
from tasks.gpu import GpuProbe, open_probe
from tasks.job import Job
from tasks.redis_client import get_redis
from tasks.stages import STAGE_NAMES, dataset_stage
from tasks.workers import registry
from worker_config.settings import Settings

log = logging.getLogger("framefleet.metrics")

STAGE_LOG_KEPT = 100_000  # newest entries of a run's stage log kept (5 stages of 20,000 videos)
STAGE_LOG_TTL_S = 30 * 24 * 3600  # a run that never ends (its callback never ran): how long its log stays
COUNTS_KEY = keys.METRIC_COUNTS
DURATIONS_KEY = keys.METRIC_DURATIONS
AUTOSCALE_KEY = keys.AUTOSCALE_LOG
QUARANTINED_KEY = keys.QUARANTINED  # output root -> videos in its quarantine (tasks.records.quarantine)
DURATION_BUCKETS_S = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
OUTCOMES = ("done", "skipped", "failed")
MIB = float(1 << 20)


def stage_log_key(run_id: str) -> str:
    return keys.RUN_PREFIX + run_id + keys.RUN_STAGES_SUFFIX


def stage_record(stage: str, job: Job) -> dict[str, Any]:
    """The stage-log entry of ``job`` just after ``stage`` finished (its timing) or failed for good.

    The run is the log's (one list per run), not a field of each entry.
    """
    entry = {"video": job.video_id, "stage": stage, "gpu": job.gpu}
    failed = job.failed
    if failed:
        return {
            **entry,
            "ok": False,
            "end": failed.time,
            "worker": failed.worker,
            "error_class": failed.error_class,
        }
    timing = job.timings[stage]
    return {
        **entry,
        "ok": True,
        "start": timing.start,
        "end": timing.end,
        "skipped": timing.skipped,
        "worker": timing.worker,
        "run_s": timing.run_s,
    }


def record_stage(redis_url: str, stage: str, job: Job) -> None:
    """Count ``stage`` of ``job`` (done, skipped or failed for good) and log it in Redis; never raises."""
    try:
        pipe = get_redis(redis_url).pipeline(transaction=False)
        add_stage(pipe, stage, job)
        pipe.execute()
    except Exception as exc:  # metrics are not worth failing a video for
        log.warning("metrics of %s not recorded: %s", stage, exc)


def add_stage(pipe: Any, stage: str, job: Job, ttl_s: int = STAGE_LOG_TTL_S) -> None:
    """Queue on ``pipe`` (a Redis pipeline; the caller executes it) what record_stage writes."""
    entry = stage_record(stage, job)
    log_key = stage_log_key(job.run_id)
    pipe.rpush(log_key, json.dumps(entry, separators=(",", ":")))
    pipe.ltrim(log_key, -STAGE_LOG_KEPT, -1)
    pipe.expire(log_key, ttl_s)
    outcome = "failed" if not entry["ok"] else "skipped" if entry["skipped"] else "done"
    pipe.hincrby(COUNTS_KEY, f"stage|{stage}|{outcome}", 1)
    if outcome == "failed":
        pipe.hincrby(COUNTS_KEY, f"videos_failed|{stage}|{entry['error_class']}", 1)
    elif stage == dataset_stage().name:
        pipe.hincrby(COUNTS_KEY, "videos_done", 1)
    if outcome == "done":
        seconds = entry["end"] - entry["start"]
        for le in [*DURATION_BUCKETS_S, float("inf")]:
            if seconds <= le:
                pipe.hincrby(DURATIONS_KEY, f"{stage}|{le:g}", 1)
        pipe.hincrbyfloat(DURATIONS_KEY, f"{stage}|sum", seconds)


class AutoscaleTally:
    """Counts of the autoscaler's decisions (``ff:autoscale``) that only grow, though the list is trimmed."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.seen_until = float("-inf")
        self.lock = threading.Lock()

    def update(self, raws: list[str]) -> Counter[tuple[str, str]]:
        with self.lock:
            latest = self.seen_until
            for raw in raws:
                try:
                    record = json.loads(raw)
                    when = float(record["time"])
                except (ValueError, KeyError, TypeError):
                    continue
                if when > self.seen_until:
                    self.counts[(str(record.get("gpu")), str(record.get("action")))] += 1
                    latest = max(latest, when)
            self.seen_until = latest
            return Counter(self.counts)


class FramefleetCollector:
    """A prometheus_client Collector that reads everything at scrape time; a source that fails is
    reported as ``framefleet_up{source=...} 0`` and the other sources' metrics still come."""

    def __init__(self, conf: Settings, probe: GpuProbe) -> None:
        self.conf, self.probe = conf, probe
        self.autoscale = AutoscaleTally()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("framefleet_up", "1 when the source could be read at this scrape", labels=["source"])
        try:
            yield from self._gpus()
            up.add_metric(["gpu"], 1)
        except Exception as exc:
            log.warning("GPU metrics not read: %s", exc)
            up.add_metric(["gpu"], 0)
        try:
            yield from self._redis()
            up.add_metric(["redis"], 1)
        except (redis.RedisError, OSError) as exc:
            log.warning("Redis metrics not read: %s", exc)
            up.add_metric(["redis"], 0)
        yield up

    def _gpus(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["gpu", "uuid", "name"]
        used = GaugeMetricFamily("framefleet_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
        total = GaugeMetricFamily("framefleet_gpu_memory_total_bytes", "GPU memory in all", labels=labels)
        util = GaugeMetricFamily(
            "framefleet_gpu_utilization_ratio", "Fraction of the last sample period a kernel ran (0-1)", labels=labels
        )
        readings = self.probe.gpus()
        for g in readings:
            values = [str(g.index), g.uuid, g.name]
            used.add_metric(values, g.used_mib * MIB)
            total.add_metric(values, g.total_mib * MIB)
            util.add_metric(values, g.utilization_pct / 100.0)
        count = GaugeMetricFamily("framefleet_gpus", "GPUs the probe reads (0 without a GPU)", labels=["probe"])
        count.add_metric([self.probe.mode], len(readings))
        yield from (used, total, util, count)

    def _redis(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        r, broker = get_redis(self.conf.redis_url), get_redis(self.conf.broker)
        workers = registry.live_workers(r)
        yield from self._workers(workers)
        queues = sorted(
            {self.conf.cpu_queue}
            | registry.known_gpu_queues(r)
            | {q for w in workers for q in w.get("queues", [])}
            | settings_queues.listed(r)
        )
        depth = GaugeMetricFamily(
            "framefleet_queue_depth", "Messages waiting in the queue (all its priorities)", labels=["queue"]
        )
        for queue, waiting in queue_lengths(broker, queues).items():
            depth.add_metric([queue], waiting)
        yield depth

        counts = {k: int(v) for k, v in r.hgetall(COUNTS_KEY).items()}
        durations = {k: float(v) for k, v in r.hgetall(DURATIONS_KEY).items()}
        hist = HistogramMetricFamily(
            "framefleet_stage_duration_seconds", "Run time of a stage task that did work", labels=["stage"]
        )
        tasks = CounterMetricFamily(
            "framefleet_stage_tasks", "Stage tasks finished, by outcome (failed: for good)", labels=["stage", "outcome"]
        )
        for stage in STAGE_NAMES:
            buckets = [(f"{le:g}", durations.get(f"{stage}|{le:g}", 0.0)) for le in DURATION_BUCKETS_S]
            hist.add_metric(
                [stage], [*buckets, ("+Inf", durations.get(f"{stage}|inf", 0.0))], durations.get(f"{stage}|sum", 0.0)
            )
            for outcome in OUTCOMES:
                tasks.add_metric([stage, outcome], counts.get(f"stage|{stage}|{outcome}", 0))
        done = CounterMetricFamily("framefleet_videos_done", "Videos whose HDF5 file was written")
        done.add_metric([], counts.get("videos_done", 0))
        failed = CounterMetricFamily(
            "framefleet_videos_failed",
            "Videos that failed for good, by stage and class",
            labels=["stage", "error_class"],
        )
        for key, value in counts.items():
            if key.startswith("videos_failed|"):
                failed.add_metric(key.split("|")[1:3], value)
        # A gauge: a quarantined video leaves the quarantine when a later run finishes it.
        quarantined = GaugeMetricFamily("framefleet_videos_quarantined", "Videos in quarantine, every output root")
        quarantined.add_metric([], sum(int(v) for v in r.hvals(QUARANTINED_KEY)))
        decisions = CounterMetricFamily(
            "framefleet_autoscale_decisions", "Autoscaler changes seen (ff:autoscale)", labels=["gpu", "action"]
        )
        for (gpu, action), value in sorted(self.autoscale.update(r.lrange(AUTOSCALE_KEY, 0, -1)).items()):
            decisions.add_metric([gpu, action], value)
        yield from (hist, tasks, done, failed, quarantined, decisions)

    def _workers(self, workers: list[dict[str, Any]]) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        gpu_mem = GaugeMetricFamily(
            "framefleet_worker_gpu_memory_bytes", "GPU memory a worker process holds", labels=["worker", "gpu"]
        )
        gpu_peak = GaugeMetricFamily(
            "framefleet_worker_gpu_memory_peak_bytes", "Peak GPU memory of a worker's stages", labels=["worker", "gpu"]
        )
        rss = GaugeMetricFamily("framefleet_worker_rss_bytes", "Resident host memory of a worker", labels=["worker"])
        busy = GaugeMetricFamily("framefleet_worker_busy", "1 while the worker runs a task", labels=["worker"])
        errors = CounterMetricFamily(
            "framefleet_worker_heartbeat_errors",
            "Parts of a worker's heartbeat that failed (logged; the thread goes on)",
            labels=["worker"],
        )
        per_stage = GaugeMetricFamily(
            "framefleet_workers",
            "Live workers by GPU (or cpu) and the stage they run (idle when none)",
            labels=["gpu", "stage"],
        )
        by_pid = {(p.pid, p.gpu): p.used_mib for p in self.probe.processes()}
        tally: Counter[tuple[str, str]] = Counter()
        for w in workers:
            name, gpu = w["hostname"], "cpu" if w.get("gpu") is None else str(w["gpu"])
            task = (w.get("current") or {}).get("task") or ""
            tally[(gpu, task.rsplit(".", 1)[-1] if task else "idle")] += 1
            rss.add_metric([name], float(w.get("rss_mib", 0.0)) * MIB)
            busy.add_metric([name], 1 if w.get("busy") else 0)
            errors.add_metric([name], int(w.get("heartbeat_errors", 0)))
            if gpu != "cpu":
                held = w.get("gpu_used_mib", by_pid.get((int(w.get("pid") or -1), int(w["gpu"])), 0.0))
                gpu_mem.add_metric([name, gpu], float(held) * MIB)
                gpu_peak.add_metric([name, gpu], float(w.get("gpu_peak_mib", 0.0)) * MIB)
        for (gpu, stage), n in sorted(tally.items()):
            per_stage.add_metric([gpu, stage], n)
        yield from (gpu_mem, gpu_peak, rss, busy, errors, per_stage)


@dataclass
class Exporter:
    """A running exporter: ``url`` serves the metrics; ``stop`` ends the server and closes the probe."""

    server: Any
    thread: threading.Thread
    probe: GpuProbe
    collector: FramefleetCollector

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def url(self) -> str:
        host = self.server.server_address[0]
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{self.port}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        self.probe.close()


def start_exporter(port: int, settings: Settings, addr: str = "127.0.0.1", probe: GpuProbe | None = None) -> Exporter:
    """Serve /metrics on ``addr``:``port`` (0: a free port) from a thread, reading ``probe`` (default: the
    probe ``open_probe`` picks) and the Redis of ``settings``. Raises OSError when the port is taken."""
    from prometheus_client import CollectorRegistry, start_http_server

    probe = probe or open_probe()
    collector = FramefleetCollector(settings, probe)
    metrics_registry = CollectorRegistry(auto_describe=False)
    metrics_registry.register(collector)  # type: ignore[arg-type]
    server, thread = start_http_server(port, addr, registry=metrics_registry)
    return Exporter(server, thread, probe, collector)


class GpuSampler(threading.Thread):
    """Appends every GPU's reading to a JSON-lines file each ``interval_s`` (the report plots it), until ``stop``."""

    def __init__(self, probe: GpuProbe, path: Path, interval_s: float = 2.0) -> None:
        super().__init__(name="framefleet-gpu-sampler", daemon=True)
        self.probe, self.path, self.interval_s = probe, path, interval_s
        self.stopping = threading.Event()

    def run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            while not self.stopping.is_set():
                try:
                    now = time.time()
                    for g in self.probe.gpus():
                        fh.write(
                            json.dumps(
                                {
                                    "time": now,
                                    "gpu": g.index,
                                    "used_mib": g.used_mib,
                                    "total_mib": g.total_mib,
                                    "utilization_pct": g.utilization_pct,
                                }
                            )
                            + "\n"
                        )
                    fh.flush()
                except Exception as exc:  # a missed sample is a gap in a plot
                    log.warning("GPU sample not taken: %s", exc)
                self.stopping.wait(self.interval_s)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)

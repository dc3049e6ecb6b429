"""Say why a run makes no progress: a queue with no live worker, a message held by an idle or gone
worker, a worker past its deadline, tasks waiting for a worker with their run's settings; and whether
the run's messages are gone altogether."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import redis

from tasks.delivery import leases, queues, settings_queues
from tasks.delivery.routing import job_of
from tasks.job import Job
from tasks.run import runs
from tasks.workers import registry
from worker_config.settings import CONFIG_ENV, Settings, redact_url
from worker_config.settings_match import explain, parse_settings_queue, start_command, unserved


class RunLost(RuntimeError):
    """No message of an unfinished run is left in Redis: it restarted without persistence, or was flushed."""


def _decode(raw: str | bytes) -> tuple[str, str, Job | None]:
    """Return (task name, task id, job) of a kombu message as it sits in a queue."""
    message = json.loads(raw)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, _embed = json.loads(body)
    headers = message.get("headers", {})
    return headers.get("task", ""), headers.get("id", ""), job_of(args, kwargs)


def queue_names(broker: redis.Redis, r: redis.Redis, conf: Settings) -> list[str]:
    """Every queue a framefleet task may wait in: the CPU queue and each GPU (or per-stage GPU) queue."""
    gpu = queues.gpu_queues(broker, conf, registry.known_gpu_queues(r))
    return sorted(gpu | {conf.cpu_queue} | settings_queues.listed(r))


def run_messages(r: redis.Redis, broker: redis.Redis, conf: Settings, run_id: str, callback_id: str) -> int:
    """Count the messages of run ``run_id`` (its stage tasks and its callback) waiting or in flight."""
    raws = [m for q in queue_names(broker, r, conf) for _key, m in queues.waiting(broker, q)]
    raws += [json.dumps(json.loads(entry)[0]) for entry in broker.hvals(leases.UNACKED)]
    count = 0
    for raw in raws:
        try:
            _, task_id, job = _decode(raw)
        except (ValueError, KeyError, TypeError, IndexError):
            continue
        count += task_id == callback_id or (job is not None and job.run_id == run_id)
    return count


def diagnose(r: redis.Redis, broker: redis.Redis, conf: Settings) -> list[str]:
    """Return one line per reason the queues are stuck; empty when nothing looks wrong."""
    workers = registry.live_workers(r)
    consumed = {q for w in workers for q in w.get("queues", [])}
    problems = []
    # Queues named by routing exist as lists in the broker even if no worker ever registered.
    names = sorted(queues.gpu_queues(broker, conf, registry.known_gpu_queues(r)) | {conf.cpu_queue})
    for queue, waiting in queues.lengths(broker, names).items():
        if waiting and queue not in consumed:
            problems.append(
                f"queue {queue}: {waiting} tasks waiting and no live worker; "
                + (slurm_job(queue, conf) or f"start one with `{worker_command(r, broker, conf, queue)}`")
            )
    problems += _held_by_idle_or_gone(broker, r, {w["hostname"]: w for w in workers}, conf)
    problems += waiting_for_settings(r, broker, workers, conf)
    now = time.time()
    for w in workers:
        current: dict[str, Any] = w.get("current") or {}
        if not current.get("started"):
            continue
        stage = str(current.get("task", "")).rsplit(".", 1)[-1]
        running = now - current["started"]
        deadline = conf.stages[stage].deadline_s if stage in conf.stages else None
        if deadline and running > deadline:
            problems.append(
                f"worker {w['hostname']}: {stage} of {current.get('video')} running "
                f"{running:.0f} s, past its {deadline:.0f} s deadline"
            )
    return problems


# Where Slurm's commands find the cluster when $SLURM_CONF names none: the packaged paths and a configless
# login node's cache (slurm.conf(5), "sackd").
SLURM_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf")


def on_slurm() -> bool:
    """Whether this host submits to a Slurm cluster: ``sbatch`` on PATH and a cluster's slurm.conf to read (a host
    with Slurm's package installed and no cluster configured is not one)."""
    if shutil.which("sbatch") is None:
        return False
    named = os.environ.get("SLURM_CONF", "")
    return any(Path(p).is_file() for p in (named, *SLURM_CONFS) if p)


def slurm_job(queue: str, conf: Settings) -> str:
    """On a Slurm cluster (tasks.observe.stall.on_slurm), the job to submit again for ``queue`` (a GPU job serves
    gpu0 up to gpu<N-1>, a CPU job the CPU queue), as docs/slurm.md starts them; "" elsewhere, or for a settings
    queue."""
    gpu = conf.gpu_index(queue)
    plain_gpu = gpu is not None and queue == conf.gpu_queue(gpu)
    if not (plain_gpu or queue == conf.cpu_queue) or not on_slurm():
        return ""
    scripts = Path(os.environ.get("FRAMEFLEET_HOME", "/opt/framefleet")) / "deploy" / "slurm"
    if queue == conf.cpu_queue:
        return f"on Slurm, submit a CPU job again: `sbatch {scripts / 'framefleet-cpu.sbatch'}` (docs/slurm.md)"
    return (
        f"on Slurm, submit the GPU job again (its workers serve gpu0 to gpu<N-1>): "
        f"`sbatch --gres=gpu:{(gpu or 0) + 1} {scripts / 'framefleet-gpu.sbatch'}` (docs/slurm.md)"
    )


def worker_command(r: redis.Redis, broker: redis.Redis, conf: Settings, queue: str) -> str:
    """The whole command that starts a worker of ``queue`` for the run whose task waits first there: its settings
    file and stage environment (this process's when no run is known) and its Redis, as the mismatch refusal says."""
    job = settings_queues.first_job(broker, queue)
    record = (runs.lookup(r, job.run_id) if job is not None else None) or {}
    config = record.get("config") if record else os.environ.get(CONFIG_ENV)
    tag = str((record.get("stage_settings") or {}).get("sha256", ""))[:8]
    name = f"{queue.replace('.', '-')}-{tag}" if tag else queue.replace(".", "-")
    return start_command(queue, config, record.get("settings_env") or {}, name, redact_url(conf.redis_url))


def waiting_for_settings(
    r: redis.Redis, broker: redis.Redis, workers: list[dict[str, Any]], conf: Settings
) -> list[str]:
    """One line per settings queue whose tasks wait for a worker with their run's settings, none live: what
    the run asks, what the workers run and the command that starts one that matches."""
    problems = []
    for queue, waiting in sorted(settings_queues.unconsumed(r, broker, workers).items()):
        job = settings_queues.first_job(broker, queue)
        _base, stage, digest = parse_settings_queue(queue) or ("", "?", "?")
        record = runs.lookup(r, job.run_id) if job is not None else None
        entry = ((record or {}).get("stage_settings") or {}).get("stages", {}).get(stage)
        gaps = unserved({stage: entry}, workers) if entry else []
        if entry and not gaps and any(stage in w.get("stages", []) for w in workers):
            continue  # a live worker with the run's settings now: the rebalancer moves the tasks to it
        if not gaps:
            run = f"run {job.run_id}" if job is not None else "a run"
            problems.append(
                f"queue {queue}: {waiting} tasks of {run} wait for a worker running {stage} under its settings "
                f"(sha256 {digest}…) and no live worker does"
            )
            continue
        assert record is not None and job is not None
        lines = explain(gaps, record.get("config"), record.get("settings_env") or {}, conf.cpu_queue, digest[:8])
        problems.append(
            f"run {job.run_id} waits for a worker with its settings: "
            + "; ".join(lines)
            + f" ({waiting} tasks wait in {queue})"
        )
    return problems


def _held_by_idle_or_gone(broker: redis.Redis, r: redis.Redis, workers: dict[str, Any], conf: Settings) -> list[str]:
    """One line per message in ``unacked`` (older than a lease TTL) whose owner is idle or no longer registered."""
    problems = []
    cutoff = time.time() - conf.lease_ttl_s
    for tag, since in broker.zrangebyscore(leases.UNACKED_INDEX, "-inf", cutoff, withscores=True):
        tag = tag if isinstance(tag, str) else tag.decode()
        owner = broker.get(leases.OWNER_PREFIX + tag)
        owner = owner.decode() if isinstance(owner, bytes) else owner
        entry = broker.hget(leases.UNACKED, tag)
        what = f"message {tag}"
        try:
            name, task_id, job = _decode(json.dumps(json.loads(entry)[0])) if entry else ("", "", None)
            what = f"{name.rsplit('.', 1)[-1]} of {job.video_id if job else None} (task {task_id})"
        except (ValueError, KeyError, TypeError, IndexError):
            pass
        held_s = time.time() - since
        hostname = (owner or "").partition(" ")[0]
        state = workers.get(hostname)
        if not owner:
            problems.append(
                f"{what}: in unacked for {held_s:.0f} s with no owner on record; the reaper "
                "requeues it once it has stayed unowned a lease TTL"
            )
        elif state is None:
            # Not in the registry is not gone: after a Redis restart a live worker republishes its state at its
            # next heartbeat, and meanwhile renews its lease. Gone is what the reaper takes for gone.
            if broker.exists(leases.LEASE_PREFIX + tag) or not leases.settled(broker, r, conf.lease_ttl_s):
                continue
            absent_s = registry.absent_for_s(r, hostname)
            if absent_s <= conf.lease_ttl_s:
                continue
            problems.append(
                f"{what}: held in unacked for {held_s:.0f} s by {hostname}, which is gone (not heard from for "
                f"{absent_s:.0f} s, its lease lapsed); the reaper requeues it (a live worker runs the reaper: "
                "start one)"
            )
        elif tag not in state.get("leases", [tag]):
            idle = "idle" if not state.get("busy") else "busy with another task"
            problems.append(
                f"{what}: held in unacked for {held_s:.0f} s by {hostname}, which is {idle} and no "
                "longer holds it (its ack was lost); the reaper requeues it once its lease lapses"
            )
    return problems

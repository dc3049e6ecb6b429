"""Worker start-up: pin the GPU from the queue name, preload models once, publish liveness."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import signals

from tasks.celery_app import TASK_PREFIX, settings
from tasks.delivery import leases
from tasks.errors import EXIT_CANNOT_START, ModelLoadError
from tasks.gpu import INDEX_ENV, LEDGER_ENV
from tasks.job import Job
from tasks.job_check import shown
from tasks.observe import flower_view
from tasks.stages import CPU_STAGES, GPU_STAGES, ModelStage, build
from tasks.workers import confinement, node_name
from worker_config.settings import CONFIG_ENV, Settings, stage_entry
from worker_config.settings_match import settings_queue

log = logging.getLogger("framefleet.worker")


@dataclass
class WorkerRole:
    """What this worker process is: its queues, its GPU and the stages it hosts."""

    hostname: str = ""
    queues: list[str] = field(default_factory=list)
    gpu: int | None = None
    device: str = "cpu"
    stages: list[str] = field(default_factory=list)
    settings_queues: list[str] = field(default_factory=list)  # consumed besides ``queues`` (settings_queues)


ROLE = WorkerRole()
STAGES: dict[str, Any] = {}
MODEL_LOADS: Counter[str] = Counter()
# busy_s: seconds spent in tasks, over tasks_done of them (the autoscaler's service time per task of its family)
STATE: dict[str, Any] = {"busy": False, "tasks_done": 0, "busy_s": 0.0, "current": None}
# Redis writes a task leaves to its end (tasks.pipeline: its progress and metrics), by task id: queued
# on the pipeline that marks it done and releases its claim, after Celery has sent the next stage.
AT_END: dict[str, Callable[[Any], None]] = {}


class GpuPinningError(SystemExit):
    """The worker was asked to consume queues of more than one GPU."""


def role_for(queues: list[str], hostname: str) -> WorkerRole:
    """Work out the role of a worker consuming ``queues``; refuse two GPUs' queues."""
    conf = settings()
    gpus = sorted({i for q in queues if (i := conf.gpu_index(q)) is not None})
    if len(gpus) > 1:
        raise GpuPinningError(
            f"framefleet: one worker per GPU: -Q {','.join(queues)} names GPUs {gpus}. "
            f"Start one worker per GPU queue, e.g. `celery -A tasks worker -Q {conf.gpu_queue(gpus[0])}`."
        )
    stages = [s for s in CPU_STAGES if conf.cpu_queue in queues]
    for queue in queues:
        if conf.gpu_index(queue) is None:
            continue
        _, _, own = queue.partition(".")
        if not own:  # gpuN: every enabled GPU stage that has no environment of its own
            stages += conf.hosted_stages()
        elif own not in GPU_STAGES:
            raise GpuPinningError(
                f"framefleet: queue {queue} names {own!r}, which is not a GPU stage; GPU stages are "
                f"{', '.join(GPU_STAGES)}. Consume gpuN, or gpuN.<stage> for a stage with its own python."
            )
        elif not conf.stages[own].python:
            raise GpuPinningError(
                f"framefleet: queue {queue} is for a stage with its own environment, but stages.{own}.python "
                f"is not set, so {own} tasks go to {conf.gpu_queue(gpus[0])}. Consume that queue, or set "
                f"stages.{own}.python in the settings."
            )
        else:
            _check_interpreter(own, str(conf.stages[own].python))
            stages.append(own)
    return WorkerRole(hostname, list(queues), gpus[0] if gpus else None, "cpu", list(dict.fromkeys(stages)))


def _check_interpreter(stage: str, python: str) -> None:
    """Refuse to host ``stage`` from another environment than the one its settings name."""
    here = os.path.realpath(os.path.dirname(sys.executable))
    wanted = os.path.realpath(os.path.dirname(python))
    if here != wanted:
        raise GpuPinningError(
            f"framefleet: stages.{stage}.python is {python}, but this worker runs {sys.executable}. "
            f"Start it from that environment: {python} -m celery -A tasks worker -Q gpuN.{stage}"
        )


DEVICE_ENV = "FRAMEFLEET_DEVICE"


def pin_visible_device(gpu: int) -> None:
    """Make physical GPU ``gpu`` the only one CUDA sees; must run before CUDA initialises.

    $FRAMEFLEET_DEVICE, when set, names the device outright (a container that sees only its
    reserved GPU sets it to 0, whatever the GPU's host index).
    """
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if os.environ.get(DEVICE_ENV):
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[DEVICE_ENV]
    elif inherited:
        # Under Slurm or a supervisor, gpuN means the N-th GPU this process was given.
        visible = [d for d in inherited.split(",") if d.strip()]
        if gpu >= len(visible):
            raise GpuPinningError(
                f"framefleet: queue gpu{gpu} needs GPU {gpu} but CUDA_VISIBLE_DEVICES={inherited} "
                f"gives only {len(visible)}; consume a queue between gpu0 and gpu{len(visible) - 1}."
            )
        os.environ["CUDA_VISIBLE_DEVICES"] = visible[gpu]
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


@signals.celeryd_init.connect
def on_celeryd_init(sender: str | None = None, options: dict[str, Any] | None = None, **_: Any) -> None:
    options = options or {}
    queues = options.get("queues") or [settings().cpu_queue]
    if isinstance(queues, str):
        queues = [q for q in queues.split(",") if q]
    global ROLE
    ROLE = role_for(list(queues), sender or "")
    conf = settings()
    from tasks.redis_client import get_redis

    node_name.refuse_if_taken(get_redis(conf.redis_url), sender or "", list(queues), conf.registry_ttl_s, time.time())
    confinement.STATE.update(worker=True, unconfined=bool(options.get("unconfined")))
    confinement.announce(settings())
    if ROLE.gpu is not None:
        pin_visible_device(ROLE.gpu)
        if os.environ.get(LEDGER_ENV):
            os.environ.setdefault(INDEX_ENV, str(ROLE.gpu))


def settings_queues(conf: Settings, role: WorkerRole) -> list[str]:
    """The settings queues ``role``'s worker consumes besides its own: one per queue and stage it hosts
    there, under its settings (worker_config.settings_match.settings_queue)."""
    found = []
    for queue in role.queues:
        if queue == conf.cpu_queue:
            hosted = [s for s in role.stages if s in CPU_STAGES]
        elif conf.gpu_index(queue) is None:
            continue
        else:
            own = queue.partition(".")[2]
            hosted = [own] if own else [s for s in role.stages if s in GPU_STAGES and not conf.stages[s].python]
        found += [settings_queue(queue, stage, stage_settings(stage)["sha256"]) for stage in hosted]
    return found


@signals.celeryd_after_setup.connect
def consume_settings_queues(sender: str | None = None, instance: Any = None, **_: Any) -> None:
    """Consume the settings queues of this worker's settings too: tasks handed on to it by workers without them."""
    conf = settings()
    ROLE.settings_queues = settings_queues(conf, ROLE)
    queues = instance.app.amqp.queues
    for queue in ROLE.settings_queues:
        queues.select_add(queues[queue])  # declared as routing declares it when it sends there (own exchange)
    if conf.settings_queues_only and ROLE.settings_queues:
        instance.app.amqp.queues.deselect(ROLE.queues)


@signals.worker_process_init.connect
def preload_models(**_: Any) -> None:
    """Load every hosted stage's model once; a failure ends the process before it consumes."""
    if not ROLE.stages:
        return
    try:
        device = _device_for(ROLE)
        _limit_threads(settings().torch_threads, device)
        ROLE.device = device
        for name in ROLE.stages:
            load_stage(name, device)
    except ModelLoadError as exc:
        log.critical("%s", exc)
        print(f"framefleet: {exc}", file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(EXIT_CANNOT_START)


def _limit_threads(threads: int, device: str) -> None:
    """Give torch ``threads`` CPU threads in this process (0: leave its default); only model workers use them."""
    if not threads or not any(name in GPU_STAGES for name in ROLE.stages):
        return
    import torch

    torch.set_num_threads(threads)
    log.info("torch uses %d CPU threads in this worker (%s)", threads, device)


def _device_for(role: WorkerRole) -> str:
    if role.gpu is None:
        return "cpu"
    import torch  # the worker needs it; importing `tasks` alone must not

    if torch.cuda.is_available():
        check_pinning(role.gpu, torch)
        return "cuda:0"
    log.warning("no GPU visible (CUDA unavailable): the models of gpu%d run on the CPU", role.gpu)
    print(f"framefleet: no GPU visible: gpu{role.gpu}'s models run on the CPU", file=sys.stderr)
    return "cpu"


def check_pinning(gpu: int, torch: Any) -> None:
    """Check by UUID that CUDA device 0 of this process is the GPU NVML calls the pinned one."""
    from tasks.gpu import uuid_of_visible_device

    expected = uuid_of_visible_device()
    actual = str(torch.cuda.get_device_properties(0).uuid)
    if expected is not None and expected.removeprefix("GPU-") != actual.removeprefix("GPU-"):
        raise ModelLoadError(
            f"queue gpu{gpu} should run on {expected} but CUDA device 0 is GPU-{actual}; "
            "set CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA and NVML then number GPUs alike)"
        )
    log.info("gpu%d pinned to %s", gpu, expected or f"GPU-{actual}")


def memory_state() -> dict[str, float]:
    """This process's device memory (used and peak, MiB) and resident host memory (MiB)."""
    out = {"rss_mib": _rss_mib()}
    peaks = [float(s.peak_memory_bytes) for s in STAGES.values() if isinstance(s, ModelStage)]
    torch = sys.modules.get("torch")
    if ROLE.device.startswith("cuda") and torch is not None:
        out["gpu_used_mib"] = torch.cuda.memory_reserved(0) / 2**20
        peaks.append(float(torch.cuda.max_memory_reserved(0)))
    out["gpu_peak_mib"] = max(peaks, default=0.0) / 2**20
    return out


def _rss_mib() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def load_stage(name: str, device: str) -> Any:
    """Build and load stage ``name`` on ``device``; raise ModelLoadError saying what to fix."""
    conf = settings().stages[name]
    started = time.monotonic()
    try:
        stage = build(name, conf)
        stage.load(device)
    except Exception as exc:
        raise ModelLoadError(
            f"the {name} model ({conf.backend} backend, params {conf.params}) failed to load on "
            f"{device}: {type(exc).__name__}: {exc}. Fix stages.{name}.backend/params in the "
            f"settings, or free memory on the device; this worker exits without consuming tasks."
        ) from exc
    STAGES[name] = stage
    MODEL_LOADS[name] += 1
    log.info("loaded %s (%s) on %s in %.2f s", name, conf.backend, device, time.monotonic() - started)
    return stage


def get_stage(name: str) -> Any:
    """Return the loaded stage ``name``, loading it here if this worker did not preload it."""
    stage = STAGES.get(name)
    if stage is None:
        if name in GPU_STAGES:
            log.warning("%s was not preloaded by this worker (%s); loading it now", name, ROLE.queues)
        stage = load_stage(name, ROLE.device if name in GPU_STAGES else "cpu")
    return stage


_STAGE_SETTINGS: dict[str, dict[str, Any]] = {}


def stage_settings(name: str) -> dict[str, Any]:
    """The settings this worker runs stage ``name`` under, as a run records them (``stage_entry``)."""
    if name not in _STAGE_SETTINGS:
        _STAGE_SETTINGS[name] = stage_entry(settings(), name)
    return _STAGE_SETTINGS[name]


def worker_state() -> dict[str, Any]:
    """The state this worker publishes to the registry."""
    conf = settings()
    return {
        "hostname": ROLE.hostname,
        "pid": os.getpid(),
        "host": socket.gethostname(),  # with pid, whether a worker of the same node name is live (node_name)
        # What it consumes: its queues, or only their settings queues (settings_queues_only).
        "queues": ROLE.settings_queues if conf.settings_queues_only and ROLE.settings_queues else ROLE.queues,
        "gpu_queues": [q for q in ROLE.queues if conf.gpu_index(q) is not None],
        "settings_queues": ROLE.settings_queues,
        "gpu": ROLE.gpu,
        "device": ROLE.device,
        "stages": ROLE.stages,
        # What a run's stage must match to run here (tasks.pipeline.same_settings), and where it came from.
        "settings": {name: stage_settings(name) for name in ROLE.stages},
        "config": os.environ.get(CONFIG_ENV),
        "model_loads": dict(MODEL_LOADS),
        "leases": leases.held_tags(),
        "updated": time.time(),
        **memory_state(),
        **STATE,
    }


@signals.task_received.connect
def on_task_received(request: Any = None, **_: Any) -> None:
    """Take a lease on the message at once, so a reaper never requeues what this worker holds."""
    from tasks.redis_client import get_redis

    conf = settings()
    try:
        leases.on_task_received(request, ROLE.hostname, get_redis(conf.broker), conf.lease_ttl_s)
    except Exception as exc:  # the visibility timeout still covers this message
        log.warning("no lease taken for %s: %s", getattr(request, "id", "?"), exc)


@signals.task_prerun.connect
def on_task_start(task_id: str | None = None, task: Any = None, args: Any = None, **_: Any) -> None:
    job = Job.peek(args[0]) if args else None
    STATE.update(
        busy=True,
        frames=None,
        current={
            "task": task.name if task else None,
            "task_id": task_id,
            "video": shown(job.video_id) if job else None,  # as logs and the registry show it: one line
            "run": shown(job.run_id) if job else None,
            "started": time.time(),
        },
    )
    log.info("start %s of %s (task %s)", _stage_of(task), shown(job.video_id) if job else "?", task_id)


def _stage_of(task: Any) -> str:
    """The stage (or callback) a task runs: its name without framefleet's prefix."""
    return str(getattr(task, "name", "?")).removeprefix(TASK_PREFIX)


def note_committed() -> None:
    """Record that the running task's output is written: the stage's deadline no longer applies to it.

    The deadline ends a process whose model hangs; ending one that only has its next stage to send
    and its claim to finish would cost a redelivery for nothing (the redelivery finds the output).
    """
    current = STATE.get("current")
    if current:
        STATE["current"] = {**current, "committed": time.time()}  # a new dict: the heartbeat thread reads it


@signals.task_postrun.connect
def on_task_end(
    task_id: str | None = None, task: Any = None, state: str | None = None, retval: Any = None, **_: Any
) -> None:
    """Finish the task's claim (done only if it succeeded, i.e. its continuation was sent), then recycle."""
    from tasks.delivery import claims
    from tasks.redis_client import get_redis

    current = STATE.get("current") or {}
    took_s = time.time() - current.get("started", time.time())
    STATE.update(
        busy=False, current=None, frames=None, tasks_done=STATE["tasks_done"] + 1, busy_s=STATE["busy_s"] + took_s
    )
    log.info("end %s of %s: %s in %.2f s", _stage_of(task), current.get("video") or "?", state, took_s)
    if task_id and state:
        flower_view.RECENT_ENDS.note(task_id, state, retval)
    conf = settings()
    if task_id is not None:
        tags = leases.forget(task_id)
        at_end = AT_END.pop(task_id, None)
        one_redis = conf.broker == conf.redis_url  # the leases live beside the broker's unacked messages

        def before(pipe: Any) -> None:  # one round trip with the done mark and the claim's release
            if at_end is not None:
                at_end(pipe)
            if one_redis:
                leases.release(pipe, tags, ROLE.hostname, task_id)

        done_ttl_s = claims.marks_ttl_s(conf.visibility_timeout_s)
        claims.finish(get_redis(conf.redis_url), task_id, state == "SUCCESS", done_ttl_s, before)
        if tags and not one_redis:
            leases.release_now(get_redis(conf.broker), tags, ROLE.hostname, task_id)
    rss = _rss_mib()
    if (conf.max_tasks_per_worker and STATE["tasks_done"] >= conf.max_tasks_per_worker) or (
        conf.max_rss_mib and rss > conf.max_rss_mib
    ):
        log.warning(
            "recycling after %d tasks at %.0f MiB RSS: warm shutdown; the supervisor starts a fresh worker",
            STATE["tasks_done"],
            rss,
        )
        os.kill(os.getpid(), signal.SIGTERM)


@signals.worker_ready.connect
def on_ready(sender: Any = None, **_: Any) -> None:
    from tasks.workers.heartbeat import Heartbeat

    Heartbeat.start_for(sender.app, worker_state)


@signals.worker_shutdown.connect
def on_shutdown(**_: Any) -> None:
    from tasks.workers.heartbeat import Heartbeat

    Heartbeat.stop_running(ROLE.hostname)

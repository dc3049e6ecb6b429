"""The worker the design describes from ``celery -A tasks worker -Q gpu0`` alone, and a refusal of one that breaks it.

Celery's command line fills what it is not told from its own defaults (a prefork pool of one process
per core, WARNING logs, gossip and mingle on); a flag given there wins over ``app.conf``, and
``-P prefork`` cannot be told from no ``-P`` at all once parsed. So framefleet's defaults are
applied where the options arrive, in the worker program's constructor, for exactly the options the
command line did not give (click says which it did).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

import click
from celery.apps.worker import Worker as CeleryWorker
from celery.concurrency import ALIASES
from celery.utils.log import mlevel
from celery.utils.nodenames import default_nodename, host_format
from click.core import ParameterSource

from tasks.celery_app import settings
from worker_config.settings import Settings

# framefleet's own log lines: its named loggers (framefleet.*) and its modules' (tasks.*).
OWN_LOGGERS = ("framefleet", "tasks")
ALLOW = "FRAMEFLEET_ALLOW_ANY_GPU_WORKER=1 (allow_any_gpu_worker: true)"


class WorkerDesignError(SystemExit):
    """A GPU queue's worker asked for a pool other than solo, more than one process, or several GPU queues."""


def pool_name(pool: Any) -> str | None:
    """The ``-P`` name of ``pool`` (a name, a pool class, or None when not given)."""
    if pool is None or isinstance(pool, str):
        return pool
    path = f"{pool.__module__}:{pool.__qualname__}"
    return next((name for name, alias in ALIASES.items() if alias == path), path)


def queue_list(queues: str | Iterable[str] | None) -> list[str]:
    """The queues of ``-Q`` (a comma-separated string or a list); empty when none were named."""
    if isinstance(queues, str):
        queues = queues.split(",")
    return [q.strip() for q in queues or () if q.strip()]


def design_options(conf: Settings, options: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """The worker options to change so that a worker of ``options`` is the design's worker.

    ``given``: the option names the user set (the rest are Celery's defaults and are replaced).
    A GPU queue (``gpuN`` or ``gpuN.<stage>``) gets the solo pool and one process; a CPU worker
    the same unless it asks for more processes (``-c N``: Celery's prefork pool of N, as before).
    Raises WorkerDesignError (one line: what, the value, the command that works) for a GPU queue
    with another pool or more than one process, or for two queues of one GPU (``gpu0,gpu0.hands``),
    unless ``conf.allow_any_gpu_worker``. Two GPUs' queues are refused later, whatever the settings
    (tasks.workers.worker.role_for: one process pins one GPU).
    """
    queues = queue_list(options.get("queues")) or [conf.cpu_queue]
    gpu = [q for q in queues if conf.gpu_index(q) is not None]
    pool = pool_name(options.get("pool")) if "pool" in given else None
    concurrency = options.get("concurrency") if "concurrency" in given else None
    if gpu and not conf.allow_any_gpu_worker:
        _refuse_beyond_design(conf, queues, gpu, pool, concurrency)
    # Gossip and mingle: every worker would answer every other's start and each event, traffic that
    # a fleet of solo workers (deaf while busy) gains nothing from; our heartbeat thread says who is alive.
    out: dict[str, Any] = {"without_gossip": True, "without_mingle": True}
    solo = pool == "solo" or (pool is None and (bool(gpu) or not _several(concurrency)))
    if pool is None and solo:
        out["pool"] = "solo"
    if concurrency is None and solo:
        out["concurrency"] = 1
    if "loglevel" not in given:
        out["loglevel"] = conf.log_level
    if "hostname" not in given:
        # Named after its queues, so that a host's workers of different queues differ without -n.
        out["hostname"] = f"{'+'.join(queues)}@%h"
    return out


def _refuse_beyond_design(
    conf: Settings, queues: list[str], gpu: list[str], pool: str | None, concurrency: int | None
) -> None:
    """Raise WorkerDesignError unless a worker of the GPU queues ``gpu`` is one solo process of one queue."""
    if len(gpu) > 1 and len({conf.gpu_index(q) for q in gpu}) == 1:
        raise WorkerDesignError(
            f"framefleet: -Q {','.join(queues)} names {len(gpu)} queues of one GPU, but each GPU queue has a "
            f"worker of its own (a gpuN.<stage> queue's runs that stage's python). Start "
            f"{' and '.join(_command(conf, q) for q in gpu)}, or set {ALLOW} if one worker for all is on purpose."
        )
    if pool not in (None, "solo") or _several(concurrency):
        asked = " ".join(
            part for part in (f"-P {pool}" if pool else "", f"-c {concurrency}" if concurrency else "") if part
        )
        raise WorkerDesignError(
            f"framefleet: {','.join(gpu)} is a GPU queue, whose worker is one solo process (each process "
            f"would load the models onto the GPU again), but this worker asks for {asked}. Start "
            f"`celery -A tasks worker -Q {','.join(queues)}` (solo, one process; the autoscaler packs more "
            f"workers per GPU), or set {ALLOW} if that is on purpose."
        )


def _several(concurrency: Any) -> bool:
    """Whether ``-c`` asks for more than one process (a number above 1, or ``auto``)."""
    return concurrency not in (None, 0, 1, "1")


def _command(conf: Settings, queue: str) -> str:
    """The command that starts the worker of GPU queue ``queue``, from its stage's python where it has one."""
    _, _, stage = queue.partition(".")
    if not stage:
        return f"`celery -A tasks worker -Q {queue}`"
    python = conf.stages[stage].python if stage in conf.stages else None
    return f"`{python or f'<stages.{stage}.python>'} -m celery -A tasks worker -Q {queue}`"


def given_options(options: dict[str, Any], hostname: str | None) -> set[str]:
    """The names of the options the user set: from click when the worker command parsed them, else the non-None ones."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.command.name != "worker":
        return {name for name, value in {**options, "hostname": hostname}.items() if value is not None}
    unset = (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)
    return {name for name in ctx.params if ctx.get_parameter_source(name) not in unset}


def own_loggers_at(level: str | int, celery_level: str | int) -> None:
    """Let framefleet's loggers pass ``level`` (or Celery's, when lower) whatever Celery's own level is.

    Their records reach the handlers Celery set on the root logger: a logger's level, not the
    root's, decides what it passes on.
    """
    lowest = min(mlevel(level), mlevel(celery_level) or mlevel(level))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(lowest)


def stop_if_redis_refuses_writes(conf: Settings) -> None:
    """Exit with status 5 (tasks.redis_refusal) and the cause and fix when the broker or framefleet's Redis
    answers but refuses writes (full, read-only, MISCONF); a supervisor's restart then finds it again."""
    from tasks.redis_client import get_redis
    from tasks.redis_refusal import EXIT_STATUS, write_refused

    for url in dict.fromkeys((conf.broker, conf.redis_url)):
        why = write_refused(get_redis(url))
        if why:
            print(
                f"framefleet: the worker does not start: {why}; start it again once Redis takes writes",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(EXIT_STATUS)


def _stopping_on_refusal(start: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``start`` (a blueprint's), ending the worker with status 5 and the cause and fix when Redis refuses a write
    (tasks.redis_refusal) instead of raising; any other error is raised as before."""
    from tasks.redis_refusal import EXIT_STATUS, refusal

    def start_or_stop(parent: Any) -> Any:
        try:
            return start(parent)
        except Exception as exc:
            why = refusal(exc)
            if why is None:
                raise
            print(
                f"framefleet: the worker stops: {why}; start it again once Redis takes writes",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(EXIT_STATUS) from None

    return start_or_stop


class Worker(CeleryWorker):
    """Celery's worker program, with framefleet's design for whatever the command line leaves out."""

    def __init__(self, app: Any = None, hostname: str | None = None, **options: Any) -> None:
        changes = design_options(settings(), options, given_options(options, hostname))
        if "hostname" in changes:
            hostname = host_format(default_nodename(changes.pop("hostname")))
        super().__init__(app, hostname, **{**options, **changes})

    def on_start(self) -> None:
        # Before the consumer connects: kombu's first write to a full Redis ends the worker with a traceback.
        stop_if_redis_refuses_writes(settings())
        super().on_start()

    def start(self) -> None:
        # A Redis a few KB from its maxmemory takes the probe above, then refuses one of kombu's writes as the
        # consumer connects (its mutex, a pipeline): Celery would log "Unrecoverable error" and a traceback and
        # exit 1. The same cause and fix as the probe's, and its exit status, instead.
        self.blueprint.start = _stopping_on_refusal(self.blueprint.start)
        super().start()

    def setup_logging(self, colorize: bool | None = None) -> Any:
        custom = super().setup_logging(colorize)
        own_loggers_at(settings().log_level, self.loglevel)
        return custom

"""A queue's messages across its priority lists in Redis, and the priority of a stage's task.

kombu's Redis transport keeps one list per priority step: the queue's own name for step 0 and
``queue + SEP + step`` for the others; a worker's BRPOP names every step of every queue it
consumes, steps first, so step 0 of any of its queues is taken before step 1 of any
(kombu/transport/redis.py, Channel._brpop_start, _q_for_pri and _put, kombu 5.7.0); a message
restored from ``unacked`` goes back to its own priority's list (_do_restore_message). On Redis
priority 0 is the highest. Everything that reads, counts or moves waiting messages goes
through this module, so that no list of a queue is overlooked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from tasks.stages import STAGE_NAMES
from worker_config.settings import Settings

# One list per Celery priority 0-9 (kombu's default steps [0, 3, 6, 9] would merge neighbouring stages).
PRIORITY_STEPS: tuple[int, ...] = tuple(range(10))
# kombu's default separator; changing it would orphan the members of kombu's existing binding
# sets (``_kombu.binding.*``, joined with the same separator) in a Redis that outlives an upgrade.
SEP = "\x06\x16"


def transport_options() -> dict[str, Any]:
    """The broker transport options that make kombu keep (and BRPOP) one list per priority."""
    return {"priority_steps": list(PRIORITY_STEPS), "sep": SEP}


def key_for(queue: str, priority: int) -> str:
    """The Redis list holding ``queue``'s messages of ``priority`` (0-9, 0 highest)."""
    step = max(PRIORITY_STEPS[0], min(int(priority), PRIORITY_STEPS[-1]))
    return f"{queue}{SEP}{step}" if step else queue


def physical_keys(queue: str) -> list[str]:
    """Every Redis list of logical queue ``queue``, highest priority first (the order a worker takes them)."""
    return [key_for(queue, step) for step in PRIORITY_STEPS]


def logical_name(key: str | bytes) -> str:
    """The queue a Redis list belongs to: ``key`` without its priority suffix."""
    name = key.decode() if isinstance(key, bytes) else key
    base, sep, step = name.rpartition(SEP)
    return base if sep and step.isdigit() else name


def lengths(broker: redis.Redis, queues: Iterable[str]) -> dict[str, int]:
    """Messages waiting in each of ``queues``, every priority list counted, in one round trip."""
    names = list(dict.fromkeys(queues))
    if not names:
        return {}
    pipe = broker.pipeline(transaction=False)
    for name in names:
        for key in physical_keys(name):
            pipe.llen(key)
    sizes = pipe.execute()
    width = len(PRIORITY_STEPS)
    return {name: sum(int(n) for n in sizes[i * width : (i + 1) * width]) for i, name in enumerate(names)}


def length(broker: redis.Redis, queue: str) -> int:
    """Messages waiting in ``queue``, every priority list counted."""
    return lengths(broker, [queue])[queue]


def waiting(broker: redis.Redis, queue: str) -> list[tuple[str, Any]]:
    """(list key, raw message) of every message waiting in ``queue``, highest priority first."""
    return [(key, raw) for key in physical_keys(queue) for raw in broker.lrange(key, 0, -1)]


def stage_priority(stage: str, chain: Sequence[str] | None = None) -> int:
    """The Celery priority of ``stage``'s task (0 highest): the fewer stages after it in ``chain``, the higher.

    A video's last stage gets 0, so a video that has started finishes before the next one begins;
    a stage missing from ``chain`` is placed by its position among all the stages.
    """
    order = tuple(chain) if chain and stage in chain else STAGE_NAMES
    after = len(order) - 1 - order.index(stage)
    return min(after, PRIORITY_STEPS[-1])


def message_priority(raw: str | bytes) -> int:
    """The priority a kombu message as stored in Redis was sent with (0 when it has none)."""
    try:
        return int(json.loads(raw)["properties"]["priority"])
    except (ValueError, KeyError, TypeError):
        return 0


CANDIDATE_GPUS = 16  # GPU indices whose queues are looked at even when no worker ever consumed them


def gpu_queues(broker: redis.Redis, conf: Settings, known: set[str]) -> set[str]:
    """Every GPU queue a task may wait in: ``known`` (those a worker ever consumed, the registry's
    ``ff:gpu-queues``) and those of GPUs 0 … CANDIDATE_GPUS - 1 and of every known GPU that hold messages:
    routing queues a task where no worker ever consumed when none hosts its stage, and a worker may die
    before it registers. The stall report and the rebalancer both read this, so they see the same queues.
    One round trip of LLENs (a queue is a list per priority), never a scan of every key: beside a
    million-video run that was a round trip per 500 of its 130,000 keys."""
    gpus = set(range(CANDIDATE_GPUS)) | {i for q in known if (i := conf.gpu_index(q)) is not None}
    names = {conf.gpu_queue(i) for i in gpus} | {
        f"{conf.gpu_queue(i)}.{s}" for i in gpus for s in conf.own_env_stages()
    }
    return set(known) | {queue for queue, waiting in lengths(broker, sorted(names)).items() if waiting}

"""A run's done marks and start counts, compact while the run is live: a million videos' worth in tens of MB.

A finished stage task is remembered by an 8-byte integer, its mark (a digest of its task id), in one
of the run's sets of done marks (``ff:run:<run>:done:<shard>``). The sets are spread over the
shards the run's record fixes before its first video is sent (``shards``, tasks.statistics.sums: 32 to 64
videos each, or about 15 at a million when the size is not known ahead), so each holds a few
hundred marks at most: under Redis's ``set-max-intset-entries`` (512), stored as a sorted array of
8-byte integers. The shard is chosen by other bits of the digest than the mark's, so two task ids
are confused only when 63 + log2(shards) bits agree.

A task's starts are counted in the run's hash ``ff:run:<run>:attempts`` (task id → starts) only
until it is done: its done mark then stands for it (a later delivery is dropped before it is
counted), so the hash holds the tasks in flight, not one field per task of the run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tasks import keys


@dataclass(frozen=True)
class Marks:
    """Where one task of a run is marked: its done-marks set and mark, and the run's start counts."""

    done_key: str
    mark: int
    attempts_key: str


def mark_of(task_id: str) -> tuple[int, int]:
    """(the task's mark: 63 bits of its id's digest, a non-negative int64; 32 other bits that choose its shard)."""
    digest = hashlib.blake2b(task_id.encode(), digest_size=12).digest()
    return int.from_bytes(digest[:8], "little") >> 1, int.from_bytes(digest[8:], "little")


def done_key(run_id: str, shard: int) -> str:
    return f"{keys.RUN_PREFIX}{run_id}{keys.RUN_DONE_SUFFIX}:{shard:x}"


def done_keys(run_id: str, shards: int) -> list[str]:
    """Every done-marks key a run of ``shards`` shards may have written (to delete them: no scan)."""
    return [done_key(run_id, i) for i in range(shards)]


def attempts_key(run_id: str) -> str:
    return keys.RUN_PREFIX + run_id + keys.RUN_ATTEMPTS_SUFFIX


def of(run_id: str, task_id: str, shards: int) -> Marks:
    """Where ``task_id`` of ``run_id`` (a run of ``shards`` shards) is marked done and counted."""
    mark, spread = mark_of(task_id)
    return Marks(done_key(run_id, spread % shards), mark, attempts_key(run_id))


def where(r: Any, run_id: str, task_id: str) -> Marks:
    """Where ``task_id`` of ``run_id`` is marked (``of`` with the run's shard count, tasks.statistics.sums.run_shards).
    Raises redis.RedisError."""
    from tasks.statistics import sums

    return of(run_id, task_id, sums.run_shards(r, run_id))

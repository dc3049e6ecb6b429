"""A run's record, OUT/runs/<run_id>.json: what was sent, and how the run ended (finished or cancelled);
beside it, the run's stage log, OUT/runs/<run_id>.stages.jsonl, written when it ends."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tasks import keys
from tasks.outputs.storage import write_text_atomic

FOLDER = "runs"


def path(out_dir: Path, run_id: str) -> Path:
    return out_dir / FOLDER / f"{run_id}.json"


def write(out_dir: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` (it holds ``run_id``) atomically; return its path."""
    where = path(out_dir, record["run_id"])
    where.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(where, json.dumps(record, indent=1, sort_keys=True))
    return where


def read(out_dir: Path, run_id: str) -> dict[str, Any] | None:
    """The record of ``run_id`` in ``out_dir``, or None when there is none (or it cannot be read)."""
    try:
        return json.loads(path(out_dir, run_id).read_text())
    except (OSError, ValueError):
        return None


def stage_log_path(out_dir: Path, run_id: str) -> Path:
    return out_dir / FOLDER / f"{run_id}.stages.jsonl"


def save_stage_log(r: Any, out_dir: Path, run_id: str) -> int:
    """Write the run's stage log from Redis to OUT/runs/<run_id>.stages.jsonl (atomically); return its entries.

    Nothing is written when Redis holds no entry (the file of an earlier call stays).
    Raises redis.RedisError.
    """
    from tasks.observe.metrics import stage_log_key

    raws = r.lrange(stage_log_key(run_id), 0, -1)
    if raws:
        lines = "".join((raw.decode() if isinstance(raw, bytes) else raw) + "\n" for raw in raws)
        write_text_atomic(stage_log_path(out_dir, run_id), lines)
    return len(raws)


def stage_log(r: Any, out_dir: Path | None, run_id: str, last: int = 0) -> tuple[list[dict[str, Any]], str]:
    """The run's stage log (its ``last`` entries; 0: all) and where it came from: Redis while the run
    is live, else its file in OUT/runs/, else none ("")."""
    from tasks.observe.metrics import stage_log_key

    try:
        raws = r.lrange(stage_log_key(run_id), -last if last else 0, -1) if r is not None else []
    except Exception:  # the file, then
        raws = []
    if raws:
        return _entries(raws), "Redis"
    path = stage_log_path(out_dir, run_id) if out_dir is not None else None
    try:
        lines = path.read_text().splitlines() if path is not None else []
    except OSError:
        return [], ""
    entries = _entries([line for line in lines[-last if last else 0 :] if line.strip()])
    return entries, str(path) if entries else ""


def _entries(raws: list[Any]) -> list[dict[str, Any]]:
    """The stage log's entries (JSON text or bytes, one each), parsed in one call (100,000 of them at the end
    of a large run)."""
    texts = [raw.decode() if isinstance(raw, bytes) else raw for raw in raws]
    return list(json.loads("[" + ",".join(texts) + "]"))


def latest(out_dir: Path) -> dict[str, Any] | None:
    """The record of the newest run in ``out_dir`` (run ids begin with their start time), or None."""
    for candidate in sorted((out_dir / FOLDER).glob("*.json"), reverse=True):
        record = read(out_dir, candidate.stem)
        if record is not None:
            return record
    return None


def update(out_dir: Path, run_id: str, **fields: Any) -> dict[str, Any]:
    """Add ``fields`` to the record of ``run_id`` (one is made if missing); return the new record.

    A run already marked cancelled stays cancelled: its callback may still finish afterwards.
    """
    record = read(out_dir, run_id) or {"run_id": run_id}
    if record.get("status") == "cancelled" and fields.get("status") not in (None, "cancelled"):
        fields = {k: v for k, v in fields.items() if k != "status"}
    record.update(fields)
    write(out_dir, record)
    return record


def finished(out_dir: Path, run_id: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Record that the run's statistics callback ran: its finish time and counts. The callback's last write
    (tasks.run.aggregate): once the record says "finished", every file of the run's end is in place (``ended``)."""
    return update(
        out_dir,
        run_id,
        status="finished",
        finished=summary.get("finished", time.time()),
        done=summary.get("done"),
        failed=len(summary.get("failed", [])),
    )


def ended(out_dir: Path, run_id: str) -> bool:
    """Whether the run's end has written all it writes (its record "finished", the end's last write); a
    cancelled run whose callback finished afterwards counts too (its record stays "cancelled", with ``finished``)."""
    record = read(out_dir, run_id) or {}
    return record.get("status") == "finished" or (record.get("status") == "cancelled" and "finished" in record)


RUNS_KEPT = 1000  # runs listed in ff:runs (the newest; an older run is still found by its id or its OUT)


def redis_key(run_id: str) -> str:
    """The run's one lasting hash (tasks.keys.RUN_PREFIX): its record, counters and end."""
    return keys.RUN_PREFIX + run_id


def publish(r: Any, record: dict[str, Any], ttl_s: int) -> None:
    """Keep the run's record in Redis too, so `framefleet status --watch RUN` and `cancel RUN` find its OUT."""
    pipe = r.pipeline()
    pipe.hset(redis_key(record["run_id"]), keys.RUN_RECORD_FIELD, json.dumps(record, separators=(",", ":")))
    pipe.expire(redis_key(record["run_id"]), ttl_s)
    pipe.zadd(keys.RUNS, {record["run_id"]: float(record.get("started") or time.time())})
    pipe.zremrangebyrank(keys.RUNS, 0, -RUNS_KEPT - 1)
    pipe.execute()


def lookup(r: Any, run_id: str) -> dict[str, Any] | None:
    """The record ``publish`` kept for ``run_id``, or None (an unknown or expired run)."""
    raw = r.hget(redis_key(run_id), keys.RUN_RECORD_FIELD) or r.get(keys.RUN_INFO_PREFIX + run_id)
    return json.loads(raw) if raw else None


def newest_ids(r: Any, count: int = 1) -> list[str]:
    """The ids of the ``count`` newest runs Redis lists, newest first (one read, never a scan of the keys)."""
    return [i.decode() if isinstance(i, bytes) else i for i in r.zrevrange(keys.RUNS, 0, count - 1)]


def newest_in_redis(r: Any) -> dict[str, Any] | None:
    """The record of the newest run Redis knows, or None."""
    for run_id in newest_ids(r, 10):  # an expired run's id may linger in the list
        record = lookup(r, run_id)
        if record is not None:
            return record
    return None


class RunNotFound(LookupError):
    """No record of the run asked for; the message says where it looked and what to give instead."""


def find(r: Any, run_id: str | None, out_dir: Path | None) -> dict[str, Any]:
    """The record of ``run_id`` (from Redis, else OUT/runs/), or of the newest run in ``out_dir``.

    Raises RunNotFound with what was looked at and what to pass instead.
    """
    if run_id:
        record = (read(out_dir, run_id) if out_dir else None) or lookup(r, run_id)
        if record is None:
            where = f"{path(out_dir, run_id)} or Redis" if out_dir else "Redis"
            raise RunNotFound(f"no run {run_id} in {where}; give the run's output folder with --out OUT")
        return record
    if out_dir is not None:
        record = latest(out_dir)
        if record is None:
            raise RunNotFound(f"no run record in {out_dir / FOLDER}; is {out_dir} a framefleet output folder?")
        return record
    record = newest_in_redis(r)
    if record is None:
        raise RunNotFound("Redis knows no run; give a run id or --out OUT")
    return record

"""Quarantine: one record per video that failed for good, in OUT/quarantine.jsonl; Redis keeps only how many
per output root (for the metrics and `framefleet status` without OUT), in one hash."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import redis

from tasks import keys
from tasks.outputs.storage import write_text_atomic

log = logging.getLogger("framefleet.quarantine")
FILE = "quarantine.jsonl"


def root_field(out_root: Path) -> str:
    """The field of ``out_root`` in tasks.keys.QUARANTINED."""
    return hashlib.sha256(str(out_root.resolve()).encode()).hexdigest()[:12]


def counts(r: redis.Redis) -> dict[str, int]:
    """How many videos each output root holds in quarantine, by root field (one read)."""
    return {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in r.hgetall(keys.QUARANTINED).items()}


def read(out_root: Path) -> dict[str, dict[str, Any]]:
    """Return the quarantined videos of ``out_root`` by video id."""
    path = out_root / FILE
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["video_id"]: r for r in records}


def update(out_root: Path, failed: list[dict[str, Any]], done: list[str], r: redis.Redis | None) -> list[dict]:
    """Add this run's failures, release the videos now done; return the quarantine."""
    records = read(out_root)
    for vid in done:
        records.pop(vid, None)
    for record in failed:
        records[record["video_id"]] = record
    ordered = [records[k] for k in sorted(records)]
    write_text_atomic(out_root / FILE, "".join(json.dumps(rec, sort_keys=True) + "\n" for rec in ordered))
    if r is not None:
        try:
            pipe = r.pipeline()
            if ordered:
                pipe.hset(keys.QUARANTINED, root_field(out_root), len(ordered))
            else:
                pipe.hdel(keys.QUARANTINED, root_field(out_root))
            pipe.delete(keys.LEGACY_QUARANTINE_PREFIX + root_field(out_root))  # an earlier version's copy
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("quarantine not counted in Redis: %s", exc)
    return ordered

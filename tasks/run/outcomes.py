"""A finished video's outcome as Redis keeps it while its run is live: compact, the shared fields once per run.

Outcomes of one run are alike (the same stages, backends, settings hash, framefleet commit, workers,
quality keys), so each is deflated against a preset dictionary of the run: the first outcome recorded,
kept once in ``ff:run:<run>:outcome-dict``. What is shared then costs a few bytes of back-reference per
video: about 190 B instead of 2.1 KB. Stage times are kept to the millisecond (the summary's per-stage
means and gaps need no more). An outcome of an earlier version (plain JSON) is read as it is.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterator
from typing import Any

import redis

from tasks import keys

log = logging.getLogger("framefleet.outcomes")
PACKED = b"z"  # first byte of a deflated outcome; a plain JSON outcome starts with "{"
_DICTS: dict[str, bytes] = {}  # run id -> its preset dictionary, as this process fetched or set it


def dict_key(run_id: str) -> str:
    return keys.RUN_PREFIX + run_id + keys.RUN_OUTCOME_DICT_SUFFIX


def compact(outcome: dict[str, Any]) -> bytes:
    """The outcome as compact JSON, stage times rounded to the millisecond."""
    timings = outcome.get("timings")
    if timings:
        outcome = {
            **outcome,
            "timings": {
                stage: {
                    k: round(v, 3) if k in ("start", "end", "run_s") and isinstance(v, float) else v
                    for k, v in t.items()
                }
                for stage, t in timings.items()
            },
        }
    return json.dumps(outcome, separators=(",", ":")).encode()


def encode(r: redis.Redis, run_id: str, outcome: dict[str, Any], ttl_s: int) -> bytes:
    """The bytes to keep for ``outcome``: deflated against the run's dictionary (set now if it has none).
    Raises redis.RedisError."""
    plain = compact(outcome)
    zdict = _DICTS.get(run_id)
    if zdict is None:
        if len(_DICTS) > 64:
            _DICTS.clear()
        # SET NX: the first outcome of the run becomes its dictionary; every other writer reads that one.
        if r.set(dict_key(run_id), plain, nx=True, ex=ttl_s):
            zdict = plain
        else:
            from tasks.run.partials import raw_client

            with raw_client(r) as raw:
                zdict = raw.get(dict_key(run_id)) or b""
        _DICTS[run_id] = zdict
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
    # The dictionary's checksum first: a value deflated against another dictionary (Redis flushed and
    # the dictionary set again mid-run) is refused when read, never inflated into other bytes.
    return PACKED + zlib.adler32(zdict).to_bytes(4, "little") + packer.compress(plain) + packer.flush()


def decode(value: bytes, zdict: bytes) -> dict[str, Any]:
    """An outcome kept by ``encode`` (or by an earlier version, as JSON). Raises ValueError or zlib.error."""
    if value[:1] != PACKED:
        return dict(json.loads(value))
    if value[1:5] != zlib.adler32(zdict).to_bytes(4, "little"):
        raise ValueError("an outcome deflated against another dictionary than the run's")
    unpacker = zlib.decompressobj(-15, zdict)
    return dict(json.loads(unpacker.decompress(value[5:]) + unpacker.flush()))


def read(r: redis.Redis, run_id: str, batch: int = 2000) -> Iterator[tuple[str, dict[str, Any]]]:
    """(video id, outcome) of every finished video of the run, in no order: HSCAN in batches of
    ``batch``, so no reply holds every outcome at once. Raises redis.RedisError."""
    from tasks.run.partials import raw_client

    finished = keys.RUN_PREFIX + run_id + keys.RUN_FINISHED_SUFFIX
    with raw_client(r) as raw:
        zdict = raw.get(dict_key(run_id)) or b""
        for vid, value in raw.hscan_iter(finished, count=batch):
            try:
                yield vid.decode(), decode(value, zdict)
            except (ValueError, zlib.error) as exc:
                log.error("run %s: the outcome of %s cannot be read (%s); it is left out", run_id, vid.decode(), exc)

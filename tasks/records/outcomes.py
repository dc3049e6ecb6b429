"""A finished video's outcome as Redis keeps it while its run is live: compact, the shared fields once per run.

Outcomes of one run are alike (the same stages, backends, settings hash, framefleet commit, workers,
quality keys), so each is deflated against a preset dictionary of the run: the first outcome recorded,
kept once in ``ff:run:<run>:outcome-dict`` (a hash: the dictionary's digest → it; each value starts
with its dictionary's digest, so it is never inflated against another). What is shared then costs a
few bytes of back-reference per video: about 230 B in Redis instead of 2.1 KB. Stage times are kept
to the millisecond (the summary's per-stage means and gaps need no more). An outcome of an earlier
version (plain JSON) is read as it is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Iterator, Mapping
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
    """The bytes to keep for ``outcome``: deflated against a dictionary of the run, which this call
    makes sure Redis holds (one round trip); without its video id, the field it is kept under.
    Raises redis.RedisError."""
    plain = compact({k: v for k, v in outcome.items() if k != "video_id"})
    zdict = _DICTS.get(run_id)
    if zdict is None:
        if len(_DICTS) > 64:
            _DICTS.clear()
        from tasks.statistics.partials import raw_client

        with raw_client(r) as raw:
            found = raw.hgetall(dict_key(run_id))
        # The run's dictionary another process set, else this outcome; two processes starting at once
        # may each set their own: both are kept, by digest, and each value names its own.
        zdict = found[min(found)] if found else plain
        _DICTS[run_id] = zdict
    digest = hashlib.blake2b(zdict, digest_size=8).digest()
    pipe = r.pipeline(transaction=False)
    pipe.hsetnx(dict_key(run_id), digest, zdict)  # a no-op but after a flush of Redis mid-run
    pipe.expire(dict_key(run_id), ttl_s)
    pipe.execute()
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
    return PACKED + digest + packer.compress(plain) + packer.flush()


def decode(value: bytes, dicts: Mapping[bytes, bytes]) -> dict[str, Any]:
    """An outcome kept by ``encode`` (or by an earlier version, as JSON), with the run's dictionaries by
    digest. Raises ValueError (its dictionary is not among them) or zlib.error."""
    if value[:1] != PACKED:
        return dict(json.loads(value))
    zdict = dicts.get(value[1:9])
    if zdict is None:
        raise ValueError("the dictionary this outcome was deflated against is gone")
    unpacker = zlib.decompressobj(-15, zdict)
    return dict(json.loads((unpacker.decompress(value[9:]) + unpacker.flush()).decode()))  # str: no sniffing


def read(r: redis.Redis, run_id: str, batch: int = 2000) -> Iterator[tuple[str, dict[str, Any]]]:
    """(video id, outcome) of every finished video of the run, in no order: HSCAN in batches of
    ``batch``, so no reply holds every outcome at once. Raises redis.RedisError."""
    from tasks.statistics.partials import raw_client

    finished = keys.RUN_PREFIX + run_id + keys.RUN_FINISHED_SUFFIX
    with raw_client(r) as raw:
        dicts = raw.hgetall(dict_key(run_id))
        for vid, value in raw.hscan_iter(finished, count=batch):
            video_id = vid.decode()
            try:
                found = {"video_id": video_id, **decode(value, dicts)}
            except (ValueError, zlib.error) as exc:
                log.error("run %s: the outcome of %s cannot be read (%s); it is left out", run_id, video_id, exc)
                continue
            yield video_id, found


def drop(r: redis.Redis, run_id: str) -> None:
    """Let the run's outcomes go once its end has written them to its files (UNLINK: freed off Redis's
    main thread, a million outcomes being about 224 MB). Raises redis.RedisError."""
    prefix = keys.RUN_PREFIX + run_id
    r.unlink(prefix + keys.RUN_FINISHED_SUFFIX, prefix + keys.RUN_OUTCOME_DICT_SUFFIX, prefix + keys.RUN_ORDER_SUFFIX)

"""Each video's partial statistics in one Redis hash per output root, read with one HVALS by the statistics callback.

The h5 stage's marker (OUT/markers/<video>.hdf5.done.json) stays the record of truth; this hash is
a copy that spares the callback one file read per video (50,000 markers took 7 s). An entry counts
only while its HDF5 file has the size and modification time it recorded: an output redone since
(``--force``, another Redis) or a flushed hash sends the callback back to the marker.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import stat
import struct
from pathlib import Path
from typing import Any

import redis

from tasks import keys

log = logging.getLogger("framefleet.partials")
HEADER = struct.Struct("<qq2s")  # the file's bytes, its modification time (ns), the track type


def redis_key(out_root: Path) -> str:
    return keys.PARTIALS_PREFIX + hashlib.sha256(str(out_root.resolve()).encode()).hexdigest()[:12]


@functools.cache
def row_width(track_type: str) -> int:
    """How many float64 values a row of ``track_type`` holds."""
    from tasks.run.stats import row_layout

    return sum(1 + 2 * dim for _f, dim in row_layout(track_type))


def encode(stats: dict[str, Any], track_type: str) -> bytes:
    """The partial as the bytes of its float64 row (tasks.run.stats.to_row): exact, and read without JSON."""
    from tasks.run.stats import to_row

    return to_row(stats, track_type).astype("<f8").tobytes()


def keep(r: redis.Redis, out_root: Path, video_id: str, output: Path, stats: dict[str, Any], ttl_s: int) -> None:
    """Store ``stats`` of the complete dataset file ``output`` with its size and modification time.

    An entry is HEADER, the float64 row and the video id, about 0.4 KB (the JSON of the marker's
    partial is 1.4 KB, and parsing 50,000 of them took longer than all the rest of the statistics).
    """
    st = output.stat()
    kind = stats["track_type"]
    entry = HEADER.pack(st.st_size, st.st_mtime_ns, kind.encode()) + encode(stats, kind) + video_id.encode()
    pipe = r.pipeline(transaction=False)
    pipe.hset(redis_key(out_root), video_id, entry)
    pipe.expire(redis_key(out_root), ttl_s)
    pipe.execute()


def read(r: redis.Redis | None, out_root: Path) -> dict[str, bytes]:
    """Every stored entry of ``out_root``, by video id; {} without Redis or when it fails.

    The entries are binary: they are read over a connection of their own that leaves replies as bytes.
    """
    if r is None:
        return {}
    pool = r.connection_pool
    raw = redis.ConnectionPool(
        connection_class=pool.connection_class, **{**pool.connection_kwargs, "decode_responses": False}
    )
    try:
        # HVALS, not HGETALL: half the replies for redis-py to parse, one by one, in Python.
        values = redis.Redis(connection_pool=raw).hvals(redis_key(out_root))
    except redis.RedisError as exc:
        log.warning("partial statistics not read from Redis (%s); reading the markers", exc)
        return {}
    finally:
        raw.disconnect()
    found = {}
    for value in values:
        try:
            at = HEADER.size + 8 * row_width(HEADER.unpack_from(value)[2].decode())
            found[value[at:].decode()] = value[:at]
        except (struct.error, ValueError):  # not an entry of this version: that video's marker is read
            continue
    return found


def unchanged(entry: bytes, output: str) -> bool:
    """True when ``output`` is a regular file of the size and modification time its entry recorded."""
    try:
        size, mtime_ns, _kind = HEADER.unpack_from(entry)
        st = os.lstat(output)
    except (OSError, struct.error):
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (size, mtime_ns)


def current(entry: bytes, output: str, track_type: str) -> bytes | None:
    """The row of an entry of ``track_type`` whose file ``output`` is a regular file of its size and
    modification time, else None."""
    try:
        size, mtime_ns, kind = HEADER.unpack_from(entry)
        st = os.lstat(output)  # a link in place of an output is not an output (as storage.read_marker)
    except (OSError, struct.error):
        return None
    if kind.decode() != track_type or not stat.S_ISREG(st.st_mode) or (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
        return None
    return entry[HEADER.size :]

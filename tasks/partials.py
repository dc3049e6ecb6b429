"""Each video's partial statistics in one Redis hash per output root, read with one HGETALL by the statistics callback.

The h5 stage's marker (OUT/markers/<video>.hdf5.done.json) stays the record of truth; this hash is
a copy that spares the callback one file read per video (50,000 markers took 7 s). An entry counts
only while its HDF5 file has the size and modification time it recorded: an output redone since
(``--force``, another Redis) or a flushed hash sends the callback back to the marker.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import stat
from pathlib import Path
from typing import Any

import redis

from tasks import keys

log = logging.getLogger("framefleet.partials")


def redis_key(out_root: Path) -> str:
    return keys.PARTIALS_PREFIX + hashlib.sha256(str(out_root.resolve()).encode()).hexdigest()[:12]


def encode(stats: dict[str, Any], track_type: str) -> bytes:
    """The partial as the bytes of its float64 row (tasks.stats.to_row): exact, and read without JSON."""
    from tasks.stats import to_row

    return to_row(stats, track_type).astype("<f8").tobytes()


def keep(r: redis.Redis, out_root: Path, video_id: str, output: Path, stats: dict[str, Any], ttl_s: int) -> None:
    """Store ``stats`` of the complete dataset file ``output`` with its size and modification time.

    An entry is ``"<bytes> <mtime_ns> <track type> <base64 row>"``: about 0.6 KB, where the JSON
    of the marker's partial is 1.4 KB and takes longer to parse than the rest of the callback.
    """
    st = output.stat()
    row = base64.b64encode(encode(stats, stats["track_type"])).decode()
    pipe = r.pipeline(transaction=False)
    pipe.hset(redis_key(out_root), video_id, f"{st.st_size} {st.st_mtime_ns} {stats['track_type']} {row}")
    pipe.expire(redis_key(out_root), ttl_s)
    pipe.execute()


def read(r: redis.Redis | None, out_root: Path) -> dict[str, str]:
    """Every stored entry of ``out_root``, by video id; {} without Redis or when it fails."""
    if r is None:
        return {}
    try:
        return r.hgetall(redis_key(out_root))
    except redis.RedisError as exc:
        log.warning("partial statistics not read from Redis (%s); reading the markers", exc)
        return {}


def current(entry: str, output: Path, track_type: str) -> bytes | None:
    """The row of an entry of ``track_type`` whose file ``output`` is a regular file of its size and
    modification time, else None."""
    try:
        size, mtime_ns, kind, row = entry.split(" ")
        st = os.lstat(output)  # a link in place of an output is not an output (as storage.read_marker)
        if (
            kind != track_type
            or not stat.S_ISREG(st.st_mode)
            or (st.st_size, st.st_mtime_ns) != (int(size), int(mtime_ns))
        ):
            return None
        return base64.b64decode(row, validate=True)
    except (OSError, ValueError):
        return None

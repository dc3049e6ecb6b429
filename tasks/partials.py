"""Each video's partial statistics in one Redis hash per output root, read with one HGETALL by the statistics callback.

The h5 stage's marker (OUT/markers/<video>.hdf5.done.json) stays the record of truth; this hash is
a copy that spares the callback one file read per video (50,000 markers took 7 s). An entry counts
only while its HDF5 file has the size and modification time it recorded: an output redone since
(``--force``, another Redis) or a flushed hash sends the callback back to the marker.
"""

from __future__ import annotations

import hashlib
import json
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


def keep(r: redis.Redis, out_root: Path, video_id: str, output: Path, stats: dict[str, Any], ttl_s: int) -> None:
    """Store ``stats`` of the complete dataset file ``output`` with its size and modification time."""
    st = output.stat()
    entry = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "stats": stats}
    pipe = r.pipeline(transaction=False)
    pipe.hset(redis_key(out_root), video_id, json.dumps(entry))
    pipe.expire(redis_key(out_root), ttl_s)
    pipe.execute()


def read(r: redis.Redis | None, out_root: Path) -> dict[str, str]:
    """Every stored entry of ``out_root`` as JSON text, by video id; {} without Redis or when it fails."""
    if r is None:
        return {}
    try:
        return r.hgetall(redis_key(out_root))
    except redis.RedisError as exc:
        log.warning("partial statistics not read from Redis (%s); reading the markers", exc)
        return {}


def current(entry_text: str, output: Path) -> dict[str, Any] | None:
    """The partial of an entry whose file ``output`` is a regular file of its size and time, else None."""
    try:
        entry = json.loads(entry_text)
        st = os.lstat(output)  # a link in place of an output is not an output (as storage.read_marker)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size != entry.get("bytes") or st.st_mtime_ns != entry.get("mtime_ns"):
        return None
    return entry.get("stats")

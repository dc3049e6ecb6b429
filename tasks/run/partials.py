"""Each video's partial statistics in one place: a Redis hash per output root while a run is live, and
OUT/markers/partials.bin once it has ended; read at once by the statistics callback and ``--continue``.

The h5 stage's marker (OUT/markers/<video>.hdf5.done.json) stays the record of truth; the hash and
the file are copies that spare one file read per video (50,000 markers took 7 s). The callback
writes the file from every current entry (``save``) and lets the hash expire soon after (``retire``):
Redis holds a video's partial only while its run is live. An entry counts only while its HDF5 file
has the size and modification time it recorded: an output redone since (``--force``, another
Redis) or a missing entry sends the reader back to the marker.
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
from tasks.outputs.stage_io import MARKERS_DIR
from tasks.outputs.storage import atomic_write

log = logging.getLogger("framefleet.partials")
HEADER = struct.Struct("<qq2s")  # the file's bytes, its modification time (ns), the track type
FILE = "partials.bin"  # in OUT/markers/: MAGIC, then per video RECORD, its entry and its id
MAGIC = b"framefleet partials 1\n"
RECORD = struct.Struct("<IH")  # an entry's bytes (HEADER and row), its video id's bytes


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
    entry = entry_of(output, stats) + video_id.encode()
    pipe = r.pipeline(transaction=False)
    pipe.hset(redis_key(out_root), video_id, entry)
    pipe.expire(redis_key(out_root), ttl_s)
    pipe.execute()


def entry_of(output: Path | str, stats: dict[str, Any]) -> bytes:
    """The entry (HEADER and row) of ``stats``, the partial of the complete dataset file ``output``. Raises OSError."""
    st = os.stat(output)
    kind = stats["track_type"]
    return HEADER.pack(st.st_size, st.st_mtime_ns, kind.encode()) + encode(stats, kind)


def file_path(out_root: Path) -> Path:
    return out_root / MARKERS_DIR / FILE


def save(out_root: Path, entries: dict[str, bytes]) -> None:
    """Write ``entries`` (video id -> entry) to OUT/markers/partials.bin, atomically, replacing the file."""
    chunks = [MAGIC]
    for vid in sorted(entries):
        entry, name = entries[vid], vid.encode()
        chunks += [RECORD.pack(len(entry), len(name)), entry, name]
    atomic_write(file_path(out_root), lambda tmp: tmp.write_bytes(b"".join(chunks)))


def read_file(out_root: Path) -> dict[str, bytes]:
    """The entries of OUT/markers/partials.bin by video id; {} without the file (or what precedes a damaged part)."""
    try:
        data = file_path(out_root).read_bytes()
    except OSError:
        return {}
    if not data.startswith(MAGIC):
        return {}
    found, at = {}, len(MAGIC)
    try:
        while at < len(data):
            size, name = RECORD.unpack_from(data, at)
            at += RECORD.size
            if at + size + name > len(data):
                break
            found[data[at + size : at + size + name].decode()] = data[at : at + size]
            at += size + name
    except (struct.error, UnicodeDecodeError):
        log.warning("%s is damaged past byte %d; the markers of the videos after it are read", file_path(out_root), at)
    return found


def known(r: redis.Redis | None, out_root: Path) -> dict[str, bytes]:
    """Every entry of ``out_root``: the file's, and Redis's (newer) over them."""
    return {**read_file(out_root), **read(r, out_root)}


def retire(r: redis.Redis, out_root: Path, keep_s: int) -> None:
    """Let the Redis copy go ``keep_s`` seconds from now (the file holds it). Raises redis.RedisError."""
    r.expire(redis_key(out_root), max(1, keep_s))


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

"""Each video's partial statistics in a few files of OUT/markers/, read at once by the statistics' full pass
and ``--continue``: OUT/markers/partials.bin, and the segments OUT/markers/partials/<process>.bin that
each worker process appends its videos' entries to as their dataset files are written.

The h5 stage's marker (OUT/markers/<shard>/<video>.hdf5.done.json) stays the record of truth; the
file and the segments are copies that spare one file read per video (50,000 markers took 7 s). The
full pass writes partials.bin from every current entry (``save``) and removes the segments it read.
Redis holds no entry (the run's statistics are running sums there, tasks.statistics.sums); an earlier
version kept them in a Redis hash per output root, still read while it lives. An entry counts only
while its HDF5 file has the size and modification time it recorded: an output redone since
(``--force``) or a missing entry sends the reader back to the marker.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import socket
import stat
import struct
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from tasks import keys
from tasks.outputs.stage_io import MARKERS_DIR
from tasks.outputs.storage import atomic_write
from tasks.redis_client import bytes_client

log = logging.getLogger("framefleet.partials")
HEADER = struct.Struct("<qq2s")  # the file's bytes, its modification time (ns), the track type
FILE = "partials.bin"  # in OUT/markers/: MAGIC, then per video RECORD, its entry and its id
SEGMENTS = "partials"  # OUT/markers/partials/<host>-<pid>-<token>.bin: one process's entries, the same format
MAGIC = b"framefleet partials 1\n"
RECORD = struct.Struct("<IH")  # an entry's bytes (HEADER and row), its video id's bytes


def redis_key(out_root: Path) -> str:
    return keys.PARTIALS_PREFIX + hashlib.sha256(str(out_root.resolve()).encode()).hexdigest()[:12]


@functools.cache
def row_width(track_type: str) -> int:
    """How many float64 values a row of ``track_type`` holds."""
    from tasks.statistics.stats import row_layout

    return sum(1 + 2 * dim for _f, dim in row_layout(track_type))


def encode(stats: dict[str, Any], track_type: str) -> bytes:
    """The partial as the bytes of its float64 row (tasks.statistics.stats.to_row): exact, and read without JSON."""
    from tasks.statistics.stats import to_row

    return to_row(stats, track_type).astype("<f8").tobytes()


def append(out_root: Path, video_id: str, entry: bytes) -> None:
    """Append ``video_id``'s entry (``entry_of``) to this process's segment of ``out_root``. Raises OSError.

    One process writes each segment, one ``write`` per record: a process killed mid-write leaves a
    damaged tail, which readers stop at (those videos' markers are read instead).
    """
    folder = out_root / MARKERS_DIR / SEGMENTS
    folder.mkdir(parents=True, exist_ok=True)
    name = video_id.encode()
    record = RECORD.pack(len(entry), len(name)) + entry + name
    fd = os.open(folder / _segment_name(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(fd, (MAGIC if os.fstat(fd).st_size == 0 else b"") + record)
    finally:
        os.close(fd)


def _segment_name() -> str:
    return process_name() + ".bin"


def process_name() -> str:
    """This process's name for the files it alone appends to: host, pid and a token drawn once per process
    (a pid may come back)."""
    pid = os.getpid()
    if _TOKEN.get("pid") != pid:
        _TOKEN.update(pid=pid, name=f"{socket.gethostname()}-{pid}-{uuid.uuid4().hex[:8]}")
    return str(_TOKEN["name"])


_TOKEN: dict[str, object] = {}


def segments(out_root: Path) -> list[tuple[Path, int]]:
    """(path, bytes) of every segment of ``out_root``, oldest first; [] without any."""
    try:
        with os.scandir(out_root / MARKERS_DIR / SEGMENTS) as found:
            listed = [(e.stat().st_mtime_ns, Path(e.path), e.stat().st_size) for e in found if e.name.endswith(".bin")]
    except FileNotFoundError:
        return []
    return [(p, size) for _t, p, size in sorted(listed)]


def entry_of(output: Path | str, stats: dict[str, Any]) -> bytes:
    """The entry (HEADER and row) of ``stats``, the partial of the complete dataset file ``output``. Raises OSError."""
    st = os.stat(output)
    kind = stats["track_type"]
    return HEADER.pack(st.st_size, st.st_mtime_ns, kind.encode()) + encode(stats, kind)


def file_path(out_root: Path) -> Path:
    return out_root / MARKERS_DIR / FILE


def save(out_root: Path, entries: dict[str, bytes], folded: Sequence[tuple[Path, int]] = ()) -> None:
    """Write ``entries`` (video id -> entry) to OUT/markers/partials.bin, atomically, replacing the file;
    then remove the segments ``folded`` (read into ``entries``) that have not grown since."""
    chunks = [MAGIC]
    for vid in sorted(entries):
        entry, name = entries[vid], vid.encode()
        chunks += [RECORD.pack(len(entry), len(name)), entry, name]
    atomic_write(file_path(out_root), lambda tmp: tmp.write_bytes(b"".join(chunks)))
    for path, size in folded:
        with contextlib.suppress(OSError):
            if path.stat().st_size == size:  # a segment written to since keeps its newer entries
                path.unlink()


def read_file(out_root: Path) -> dict[str, bytes]:
    """The entries of OUT/markers/partials.bin and of the segments (the newer over the older), by video id;
    {} without any (of a damaged file or segment, what precedes the damage)."""
    found = _read_one(file_path(out_root))
    for path, _size in segments(out_root):
        found.update(_read_one(path))
    return found


def _read_one(path: Path) -> dict[str, bytes]:
    try:
        data = path.read_bytes()
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
        log.warning("%s is damaged past byte %d; the markers of the videos after it are read", path, at)
    return found


def known(r: redis.Redis | None, out_root: Path) -> dict[str, bytes]:
    """Every entry of ``out_root``: the file's, and Redis's (newer) over them."""
    return {**read_file(out_root), **read(r, out_root)}


def retire(r: redis.Redis, out_root: Path, keep_s: int) -> None:
    """Let the Redis copy go ``keep_s`` seconds from now (the file holds it). Raises redis.RedisError."""
    r.expire(redis_key(out_root), max(1, keep_s))


def read(r: redis.Redis | None, out_root: Path) -> dict[str, bytes]:
    """Every entry an earlier version kept in Redis's hash for ``out_root``, by video id; {} without
    Redis, without the hash, or when Redis fails.

    The entries are binary: they are read over a connection of their own that leaves replies as bytes.
    """
    if r is None:
        return {}
    try:
        with raw_client(r) as raw:
            # HVALS, not HGETALL: half the replies for redis-py to parse, one by one, in Python.
            values = raw.hvals(redis_key(out_root))
    except redis.RedisError as exc:
        log.warning("partial statistics not read from Redis (%s); reading the markers", exc)
        return {}
    found = {}
    for value in values:
        try:
            at = HEADER.size + 8 * row_width(HEADER.unpack_from(value)[2].decode())
            found[value[at:].decode()] = value[:at]
        except (struct.error, ValueError):  # not an entry of this version: that video's marker is read
            continue
    return found


@contextlib.contextmanager
def raw_client(r: redis.Redis) -> Iterator[redis.Redis]:
    """A client of ``r``'s server on a connection of its own that leaves replies as bytes (binary values)."""
    raw, close = bytes_client(r)
    try:
        yield raw
    finally:
        close()


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

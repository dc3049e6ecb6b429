"""A run's partial statistics merged as each video's dataset file is written: running sums in Redis, so the
statistics at the run's end are one small read, not one entry per video.

``ff:run:<run>:sums`` holds, per track type, the pooled row (tasks.statistics.stats.to_row's layout: count,
mean and M2 per field, float64) and how many videos went into it. A video is merged by one Lua call
that also records it in the run's merged marks (``ff:run:<run>:merged:<shard>``: 8 bytes of the video
id's digest → the 16 bytes of its file's size and modification time), so:

- a merge delivered again (a redelivered or resent task that finds its output made) finds its mark
  with the same stamp and adds nothing;
- the same video merged with another stamp (its file made again within the run) adds nothing and
  flags the sums ``changed``: the callback then pools every video's entry instead (today's full pass);
- a worker that dies after the marker and before the merge leaves a video out of the sums; the
  callback sees the sums count fewer videos than OUT/markers holds and takes the full pass. The
  sums are used only when they cover every marker in OUT (``covering``), so nothing is counted
  twice or left out: at worst the run's end is as slow as before.

The marks are spread over shards of about 64 videos (a power of two from the run's size), small
enough for Redis's compact listpack encoding: about 30 B per video.

The sums also keep a digest of the videos merged (the sum of their marks, as four 16-bit limbs: adding
a video twice or leaving one out changes it), and the run's end writes the statistics it used to
``OUT/markers/sums.json`` (the pooled row, exact float64, with the count and digest of the videos it
covers). A later run (``--continue``, ``--add``) whose own sums hold the videos OUT gained since uses
that file plus its sums when the count and the digest of OUT's markers say they cover every marker
once; otherwise, and for a file of another track type, the full pass (``covering``). Beside them the
file keeps the statistics file's backend sets when they count exactly the videos the sums cover
(``load_sets``; tasks.statistics.stats_file adds a run's to them instead of reading the manifest).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import operator
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis

from tasks import keys
from tasks.statistics.stats import Moments, VideoStats, row_layout

log = logging.getLogger("framefleet.sums")
PER_SHARD = 64  # videos per merged-marks hash: under Redis's hash-max-listpack-entries (128 by default)
MAX_SHARDS = 1 << 16
RUNS_REMEMBERED = 64  # run ids whose shard count a process keeps (a worker serves a few runs at a time)
_RUN_SHARDS: dict[str, int] = {}
_lock = threading.Lock()
CHANGED_FIELD = "changed"  # set when a video was merged again with another file: the sums are not used
FILE = "sums.json"  # in OUT/markers/: the statistics the last run's end wrote, with the videos they cover
LIMBS = 4  # a digest is the sum of the videos' 8-byte marks as four 16-bit limbs (exact in Redis's integers)

# KEYS: the sums hash, the video's shard of merged marks. ARGV: the video's mark (8 B), its stamp
# (16 B), the track type, the row (float64, to_row's layout), the fields' feature counts ("3,1,9,3,6"),
# the TTL (s). Returns 1 merged, 0 merged before with this stamp, 2 merged before with another stamp.
# The merge is Moments.__add__'s (Chan's formula), field by field, in Lua's float64.
_MERGE = """
local seen = redis.call('HGET', KEYS[2], ARGV[1])
if seen then
  if seen == ARGV[2] then return 0 end
  redis.call('HSET', KEYS[1], 'changed', ARGV[1])
  return 2
end
local dims = {}
local width = 0
for d in string.gmatch(ARGV[5], '%d+') do
  dims[#dims + 1] = tonumber(d)
  width = width + 1 + 2 * tonumber(d)
end
local fmt = '<' .. string.rep('d', width)
local b = {struct.unpack(fmt, ARGV[4])}
local field = 'row:' .. ARGV[3]
local cur = redis.call('HGET', KEYS[1], field)
local out = b
if cur then
  local a = {struct.unpack(fmt, cur)}
  out = {}
  local at = 1
  for _, dim in ipairs(dims) do
    local na, nb = a[at], b[at]
    if nb == 0 then
      for i = at, at + 2 * dim do out[i] = a[i] end
    elseif na == 0 then
      for i = at, at + 2 * dim do out[i] = b[i] end
    else
      local n = na + nb
      out[at] = n
      for j = 1, dim do
        local ma, mb = a[at + j], b[at + j]
        local delta = mb - ma
        out[at + j] = ma + delta * (nb / n)
        out[at + dim + j] = a[at + dim + j] + b[at + dim + j] + delta * delta * (na * nb / n)
      end
    end
    at = at + 1 + 2 * dim
  end
end
redis.call('HSET', KEYS[1], field, struct.pack(fmt, unpack(out, 1, width)))
redis.call('HINCRBY', KEYS[1], 'videos:' .. ARGV[3], 1)
local m = {string.byte(ARGV[1], 1, 8)}
for i = 0, 3 do
  redis.call('HINCRBY', KEYS[1], 'digest:' .. i, m[2 * i + 1] + 256 * m[2 * i + 2])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[6])
return 1
"""


def sums_key(run_id: str) -> str:
    return keys.RUN_PREFIX + run_id + keys.RUN_SUMS_SUFFIX


def shard_count(videos: int) -> int:
    """How many merged-marks hashes a run of ``videos`` spreads its marks over: a power of two, about
    PER_SHARD videos each, at most MAX_SHARDS."""
    return min(MAX_SHARDS, 1 << max(0, math.ceil(math.log2(max(1, videos) / PER_SHARD))))


def shards_of(record: dict[str, Any] | None) -> int:
    """The merged-marks shards of the run whose record this is: the count its enqueuer fixed before the
    first video was sent (``shards``: its size is known only once its folder is walked), else the count
    for its size; 1 without a record (correct at any size)."""
    if record is None:
        return 1
    if record.get("shards"):
        return int(record["shards"])
    return shard_count(int(record.get("videos") or 0))


def run_shards(r: Any, run_id: str) -> int:
    """The run's shard count (``shards_of`` its record), read once per process; 1 for a run without a record,
    read again next time (a record appears before the run's first task is sent, and never changes its count).
    Raises redis.RedisError."""
    with _lock:
        known = _RUN_SHARDS.get(run_id)
    if known is not None:
        return known
    from tasks.run import runs

    record = runs.lookup(r, run_id)
    count = shards_of(record)
    if record is not None:
        with _lock:
            if len(_RUN_SHARDS) >= RUNS_REMEMBERED:
                _RUN_SHARDS.clear()
            _RUN_SHARDS[run_id] = count
    return count


def forget_run_shards() -> None:
    """Drop the shard counts this process read (a test that reuses run ids over a flushed Redis)."""
    with _lock:
        _RUN_SHARDS.clear()


def mark_of(video_id: str) -> bytes:
    """The 8 bytes a video is known by in the merged marks (a digest: the id itself would take 3× the memory)."""
    return hashlib.blake2b(video_id.encode(), digest_size=8).digest()


def shard_key(run_id: str, mark: bytes, shards: int) -> str:
    return f"{keys.RUN_PREFIX}{run_id}{keys.RUN_MERGED_SUFFIX}:{int.from_bytes(mark[:4], 'little') % shards:x}"


def shard_keys(run_id: str, shards: int) -> list[str]:
    """Every merged-marks key a run of ``shards`` shards may have written (to delete them: no scan)."""
    return [f"{keys.RUN_PREFIX}{run_id}{keys.RUN_MERGED_SUFFIX}:{i:x}" for i in range(shards)]


def merge(r: redis.Redis, run_id: str, shards: int, video_id: str, entry: bytes, ttl_s: int) -> int:
    """Add one video's partial (``entry``: tasks.statistics.partials' header and row) to its run's sums, once.

    Returns 1 when merged now, 0 when this video was merged before with the same file (a duplicate),
    2 when it was merged before with another file (the sums are then marked changed and not used).
    Raises redis.RedisError.
    """
    return int(merge_script()(*merge_call(run_id, shards, video_id, entry, ttl_s), client=r))


def merge_call(run_id: str, shards: int, video_id: str, entry: bytes, ttl_s: int) -> tuple[list[str], list[Any]]:
    """The keys and arguments of the merge script for one video (``merge``; a pipeline may send many)."""
    from tasks.statistics import partials

    track_type = partials.HEADER.unpack_from(entry)[2].decode()
    stamp, row = entry[:16], entry[partials.HEADER.size :]
    dims = ",".join(str(dim) for _f, dim in row_layout(track_type))
    mark = mark_of(video_id)
    return [sums_key(run_id), shard_key(run_id, mark, shards)], [mark, stamp, track_type, row, dims, ttl_s]


@functools.cache
def merge_script() -> Any:
    """The merge as a redis-py Script: sent by its SHA (EVALSHA), its 2 KB text only when Redis lacks it."""
    return redis.Redis().register_script(_MERGE)  # the client is never used: every call names its own


def read(r: redis.Redis, run_id: str) -> dict[str, bytes]:
    """The run's sums hash as it is (field → bytes); {} when there is none. Raises redis.RedisError."""
    from tasks.statistics.partials import raw_client

    with raw_client(r) as raw:
        found = raw.hgetall(sums_key(run_id))
    return {k.decode(): v for k, v in found.items()}


def from_row(row: bytes, track_type: str) -> VideoStats:
    """The statistics a pooled row holds (tasks.statistics.stats.to_row's layout), exactly: no arithmetic on it.
    Raises ValueError when it is not a row of ``track_type``."""
    values = np.frombuffer(row, dtype="<f8")
    layout = row_layout(track_type)
    if values.size != sum(1 + 2 * dim for _f, dim in layout):
        raise ValueError(f"a {track_type} row holds {sum(1 + 2 * d for _f, d in layout)} values, not {values.size}")
    parts, at = [], 0
    for _f, dim in layout:
        parts.append(
            Moments(
                int(values[at]), values[at + 1 : at + 1 + dim].copy(), values[at + 1 + dim : at + 1 + 2 * dim].copy()
            )
        )
        at += 1 + 2 * dim
    return VideoStats(track_type, *parts)


def pooled(found: dict[str, bytes], track_type: str) -> tuple[VideoStats, int] | None:
    """(the pooled statistics, how many videos) of a sums hash of ``track_type`` alone, else None
    (changed, empty, or holding another track type: the full pass decides)."""

    if CHANGED_FIELD in found or any(f.startswith("row:") and f != "row:" + track_type for f in found):
        return None
    row, count = found.get("row:" + track_type), found.get("videos:" + track_type)
    if row is None or count is None:
        return None
    return from_row(row, track_type), int(count)


@dataclass(frozen=True)
class Covered:
    """Pooled statistics and the videos they hold: how many, and their digest (``digest_of``)."""

    total: VideoStats
    videos: int
    digest: tuple[int, ...]

    def __add__(self, other: Covered) -> Covered:
        return Covered(
            self.total + other.total, self.videos + other.videos, tuple(map(operator.add, self.digest, other.digest))
        )


def digest_of(video_ids: Iterable[str]) -> tuple[int, ...]:
    """The digest of a set of videos: the sum of their marks (``mark_of``) limb by limb, as the merge keeps it."""
    marks = b"".join(map(mark_of, video_ids))
    limbs = np.frombuffer(marks, dtype="<u2").reshape(-1, LIMBS)
    return tuple(int(v) for v in limbs.sum(axis=0, dtype=np.uint64)) if len(marks) else (0,) * LIMBS


def run_sums(found: dict[str, bytes], track_type: str) -> Covered | None:
    """A run's sums hash as ``Covered``: empty when the run merged nothing (``found`` is {}), None when
    its sums are not usable (changed, another track type, or kept by a version without the digest)."""
    if not found:
        return Covered(VideoStats.empty(track_type), 0, (0,) * LIMBS)
    got = pooled(found, track_type)
    digest = [found.get(f"digest:{i}") for i in range(LIMBS)]
    if got is None or None in digest:
        return None
    return Covered(got[0], got[1], tuple(int(d) for d in digest))  # type: ignore[arg-type]


def covering(r: Any, run_id: str, out_root: Path, track_type: str) -> tuple[Covered, str] | None:
    """The statistics of every complete video of ``out_root`` from the run's running sums, alone
    ("running sums") or added to those the last run's end saved (``load``: "running sums and earlier
    runs' sums"), and where they came from; None when they do not cover every marker exactly once (the
    full pass then runs); never raises.

    The run's sums alone: the merged videos all have markers (a video is merged after its marker is
    written), so as many as OUT holds markers means the same videos. With the saved file: the count and
    the digest of OUT's markers must equal the file's plus the run's (one listing and a hash per marker).
    """
    if r is None:
        return None
    try:
        found = read(r, run_id)
    except redis.RedisError as exc:
        log.warning("run %s: its running sums not read (%s); pooling every video's partial", run_id, exc)
        return None
    mine = run_sums(found, track_type)
    if mine is None:
        return None
    root = out_root.resolve()
    if _earlier_layout(root):
        return None
    complete = count_markers(root)
    if mine.videos and complete == mine.videos:
        return mine, "running sums"
    earlier = load(root, track_type)
    if earlier is None or earlier.videos + mine.videos != complete:
        log.info(
            "run %s: its sums hold %d videos, the earlier runs' saved sums %s, OUT %d complete ones; "
            "pooling every video's partial",
            run_id,
            mine.videos,
            "none" if earlier is None else earlier.videos,
            complete,
        )
        return None
    both = earlier + mine
    listed = marker_digest(root)
    if listed != (complete, both.digest):
        log.info(
            "run %s: its sums and the earlier runs' saved sums hold %d videos, as OUT holds, but not the same "
            "ones (a video redone or removed since); pooling every video's partial",
            run_id,
            both.videos,
        )
        return None
    return both, "running sums and earlier runs' sums"


def file_path(out_root: Path) -> Path:
    from tasks.outputs.stage_io import MARKERS_DIR

    return out_root / MARKERS_DIR / FILE


def save(out_root: Path, covered: Covered, sets: dict[str, Any] | None = None) -> None:
    """Write OUT/markers/sums.json: ``covered``'s pooled row (exact float64, as hex), count and digest, and
    ``sets`` (the statistics file's backend sets, when they count exactly ``covered``'s videos; see
    ``load_sets``). Raises OSError."""
    from tasks.outputs.storage import write_text_atomic
    from tasks.statistics.stats import to_row

    kind = covered.total.track_type
    saved = {
        "track_type": kind,
        "videos": covered.videos,
        "digest": list(covered.digest),
        "row": to_row(covered.total.to_dict(), kind).astype("<f8").tobytes().hex(),
    }
    if sets is not None:
        saved["backend_sets"] = sets
    write_text_atomic(file_path(out_root), json.dumps(saved))


def load_sets(out_root: Path) -> dict[str, Any] | None:
    """The backend sets ``save`` wrote beside the sums (``{"sets": [...], "runs": [...]}``: the done videos'
    sets, each with its ``tasks.records.lineage.set_key``, of exactly the videos the saved sums cover, and the
    runs whose outcomes the manifest held then), with ``videos``: how many; None without them."""
    try:
        saved = json.loads(file_path(out_root).read_text())
        sets = saved["backend_sets"]
        return {"sets": list(sets["sets"]), "runs": list(sets["runs"]), "videos": int(saved["videos"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load(out_root: Path, track_type: str) -> Covered | None:
    """What ``save`` wrote, when it holds ``track_type``; None without it or when it cannot be read."""
    try:
        saved = json.loads(file_path(out_root).read_text())
        if saved["track_type"] != track_type:
            return None
        total = from_row(bytes.fromhex(saved["row"]), track_type)
        return Covered(total, int(saved["videos"]), tuple(int(d) for d in saved["digest"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("%s not read (%s): the full pass decides", file_path(out_root), exc)
        return None


def marker_digest(root: Path) -> tuple[int, tuple[int, ...]]:
    """(how many dataset markers OUT/markers/ holds, the digest of their videos)."""
    from tasks.outputs.stage_io import MARKER_SUFFIX, MARKERS_DIR

    cut = len(MARKER_SUFFIX)
    names: list[str] = []
    try:
        entries = os.listdir(root / MARKERS_DIR)
    except FileNotFoundError:
        return 0, (0,) * LIMBS
    names += [n[:-cut] for n in entries if n.endswith(MARKER_SUFFIX)]
    for name in entries:
        if len(name) == 2 and os.path.isdir(shard := os.path.join(root, MARKERS_DIR, name)):
            names += [n[:-cut] for n in os.listdir(shard) if n.endswith(MARKER_SUFFIX)]
    return len(names), digest_of(names)


def count_markers(root: Path) -> int:
    """How many dataset markers OUT/markers/ holds (the videos of tasks.outputs.stage_io.marked_videos),
    counted from one listing per shard without a set of a million names."""
    from tasks.outputs.stage_io import MARKER_SUFFIX, MARKERS_DIR

    is_marker = operator.methodcaller("endswith", MARKER_SUFFIX)
    try:
        entries = os.listdir(root / MARKERS_DIR)
    except FileNotFoundError:
        return 0
    count = sum(map(is_marker, entries))
    for name in entries:
        if len(name) == 2 and os.path.isdir(shard := os.path.join(root, MARKERS_DIR, name)):
            count += sum(map(is_marker, os.listdir(shard)))
    return count


def _earlier_layout(root: Path) -> bool:
    """True when a video folder of OUT/work/ without a marker under OUT/markers/ holds an earlier
    version's dataset marker (only the full pass reads those; a failed video's folder has none).
    Without OUT/work/ (``--intermediates drop``) this is one failed ``scandir``."""
    from tasks.outputs.stage_io import marked_videos
    from tasks.stages import dataset_stage

    legacy = dataset_stage().name + ".done.json"
    try:
        with os.scandir(root / "work") as found:
            folders = [e for e in found if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return False
    if not folders:
        return False
    marked = marked_videos(root)
    return any(e.name not in marked and os.path.exists(os.path.join(e.path, legacy)) for e in folders)

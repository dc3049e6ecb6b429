"""A run's videos beyond its window, kept compact in Redis until a finishing video sends each one.

What differs between two jobs of a run is the video (its id, path, text and noun); the rest (run,
roots, chain, settings hashes, GPUs, modes) is the same for all. So ``ff:run:<id>:pending`` holds
the shared part once (field ``job``), the per-video parts in chunks of CHUNK videos (field ``c<n>``,
zlib-compressed JSON in base64: pending videos n·CHUNK … n·CHUNK+CHUNK-1, in sending order), and how
many are held (``held``); ``ff:run:<id>:pending-sent`` is a bitmap with bit i set once pending video i was sent.
About 20 B per held video instead of a 440 B job JSON in a field of its own (docs/archive/notebook.md).

Pending video i is sent by the (i+1)-th video of the run to finish (tasks.run.completion). The send
comes first, then its bit: a sender killed in between sends it again when its task is delivered
again (a second chain skips the outputs the first made and counts its video once), never zero
times. A chunk whose videos were all sent is deleted. The enqueuer adds chunks while it walks the
folder, so the i-th finish may come before video i is held: then the enqueuer sends it, as it reads
the count of finished videos in the same transaction that adds the chunk.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Callable
from typing import Any

import redis

from tasks import keys
from tasks.job import Job

CHUNK = 256  # videos per chunk: a multiple of 8 (a chunk's bits are whole bytes of the bitmap)
FLUSH_CHUNKS = 16  # whole chunks written in one round trip (4,096 videos)
FLUSH_S = 0.5  # what is buffered is written at least this often while the folder is walked slowly
JOB_FIELD, HELD_FIELD = "job", "held"
PER_VIDEO = ("video_id", "video", "text", "noun", "seal")


def hash_key(run_id: str) -> str:
    return keys.RUN_PREFIX + run_id + keys.RUN_PENDING_SUFFIX


def bits_key(run_id: str) -> str:
    return keys.RUN_PREFIX + run_id + keys.RUN_PENDING_SENT_SUFFIX


def shared_part(job: Job) -> dict[str, Any]:
    """What ``job`` shares with every job of its run: its wire form less the video's own fields."""
    return {k: v for k, v in job.to_dict().items() if k not in PER_VIDEO}


def video_part(job: Job) -> list[str]:
    """The video's own fields, shortest form: [id, path], or with text and noun when either is set; a sealed
    job's seal (tasks.run.seal) follows as well: [id, path, seal], or [id, path, text, noun, seal]."""
    part = [job.video_id, job.video, job.text, job.noun] if job.text or job.noun else [job.video_id, job.video]
    return [*part, job.seal] if job.seal else part


def encode(parts: list[list[str]]) -> str:
    """A chunk's videos as zlib-compressed JSON in base64: text, so a client that decodes replies reads it."""
    return base64.b64encode(zlib.compress(json.dumps(parts, separators=(",", ":")).encode(), 6)).decode()


def decode(chunk: str | bytes) -> list[list[str]]:
    return list(json.loads(zlib.decompress(base64.b64decode(chunk))))


class Holder:
    """Adds a run's pending videos in sending order, a chunk at a time (``add``, then ``close``).

    ``shared``: the part every job of the run shares (``shared_part``). ``send(index)`` sends pending
    video ``index`` (tasks.run.completion.send_pending); it is called for each held video whose turn
    came before it was held (see the module).
    """

    def __init__(
        self, r: redis.Redis, run_id: str, shared: dict[str, Any], ttl_s: int, send: Callable[[int], Any]
    ) -> None:
        self.r, self.run_id, self.ttl_s, self.shared, self.send = r, run_id, ttl_s, shared, send
        self.held = 0  # videos written to Redis
        self.ready: dict[str, str] = {}  # whole chunks not written yet, by field
        self.base = 0  # the index of the first video of the chunk being filled
        self.chunk: list[list[str]] = []  # its videos so far
        self.flushed_at = time.monotonic()

    def add(self, job: Job) -> None:
        """Hold ``job`` as the next pending video (its shared part is taken to be the run's)."""
        self.add_part(video_part(job))

    def add_part(self, part: list[str]) -> None:
        """Hold the next pending video given by its own fields (``video_part``)."""
        self.chunk.append(part)
        if len(self.chunk) == CHUNK:
            self.ready[f"c{self.base // CHUNK}"] = encode(self.chunk)
            self.base, self.chunk = self.base + CHUNK, []
        if len(self.ready) >= FLUSH_CHUNKS or time.monotonic() - self.flushed_at > FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write the buffered chunks (and the one being filled, so far) and send the videos already due."""
        first, total = self.held, self.base + len(self.chunk)
        if total == first:
            return
        fields: dict[str | bytes, bytes | float | int | str] = {}
        fields.update(self.ready)
        if self.chunk:  # rewritten whole as it grows
            fields[f"c{self.base // CHUNK}"] = encode(self.chunk)
        fields[HELD_FIELD] = str(total)
        if not first:
            fields[JOB_FIELD] = json.dumps(self.shared, separators=(",", ":"))
        pending = hash_key(self.run_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(pending, mapping=fields)
        pipe.expire(pending, self.ttl_s)
        pipe.hget(keys.RUN_PREFIX + self.run_id + keys.RUN_TALLY_SUFFIX, "videos")
        pipe.hlen(keys.RUN_PREFIX + self.run_id + keys.RUN_FINISHED_SUFFIX)  # an earlier version's count
        *_, videos, earlier = pipe.execute()
        finished = int(videos or 0) + int(earlier)
        self.held, self.ready, self.flushed_at = total, {}, time.monotonic()
        # Pending video i is due once i + 1 videos have finished: those finishing tasks found no chunk.
        for index in range(first, min(total, finished)):
            self.send(index)

    def close(self) -> int:
        """Write what is buffered; return how many videos are held in all."""
        self.flush()
        return self.held


def take(r: redis.Redis, run_id: str, index: int) -> Job | None:
    """Pending video ``index``'s job, or None when it was sent, dropped, or is not held yet."""
    pipe = r.pipeline(transaction=False)
    pipe.getbit(bits_key(run_id), index)
    pipe.hmget(hash_key(run_id), JOB_FIELD, f"c{index // CHUNK}")
    sent, (shared, chunk) = pipe.execute()
    if sent or shared is None or chunk is None:
        return None
    parts = decode(chunk)
    if index % CHUNK >= len(parts) or not parts[index % CHUNK]:
        return None
    vid, path, *described = parts[index % CHUNK]
    sealed = described.pop() if len(described) in (1, 3) else ""
    text, noun = described if described else ("", "")
    fields = {"video_id": vid, "video": path, "text": text, "noun": noun}
    return Job.from_dict({**json.loads(shared), **fields, **({"seal": sealed} if sealed else {})})


def mark_sent(r: redis.Redis, run_id: str, index: int, ttl_s: int) -> None:
    """Set pending video ``index``'s bit; delete its chunk once every video in it has been sent."""
    chunk = index // CHUNK
    pipe = r.pipeline(transaction=True)
    pipe.setbit(bits_key(run_id), index, 1)
    pipe.expire(bits_key(run_id), ttl_s)
    pipe.bitcount(bits_key(run_id), chunk * CHUNK // 8, (chunk + 1) * CHUNK // 8 - 1)
    pipe.hget(hash_key(run_id), HELD_FIELD)
    *_, sent_in_chunk, held = pipe.execute()
    in_chunk = min(CHUNK, int(held or 0) - chunk * CHUNK)
    if in_chunk > 0 and int(sent_in_chunk) >= in_chunk and (chunk + 1) * CHUNK <= int(held or 0):
        r.hdel(hash_key(run_id), f"c{chunk}")  # whole and all sent: no reader needs it again


def drop(r: redis.Redis, run_id: str) -> int:
    """Forget the run's unsent videos (``framefleet cancel``); return how many there were."""
    pipe = r.pipeline(transaction=True)
    pipe.hget(hash_key(run_id), HELD_FIELD)
    pipe.bitcount(bits_key(run_id))
    pipe.delete(hash_key(run_id), bits_key(run_id))
    held, sent, _ = pipe.execute()
    return max(0, int(held or 0) - int(sent))


def count(r: redis.Redis, run_id: str) -> int:
    """How many of the run's held videos are not sent yet."""
    pipe = r.pipeline(transaction=False)
    pipe.hget(hash_key(run_id), HELD_FIELD)
    pipe.bitcount(bits_key(run_id))
    held, sent = pipe.execute()
    return max(0, int(held or 0) - int(sent))

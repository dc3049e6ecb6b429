"""Send a run's videos as its folder is walked: the first ``window`` chains at once, the rest held.

The k-th video given is sent now when k < window (its job noted for the sweep first, as
tasks.run.completion.note_sent says), else held compactly in Redis (tasks.run.pending) for the
(k - window + 1)-th video to finish to send. Nothing is kept per video in this process.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import redis

from tasks.job import Job
from tasks.run import completion, pending, seal
from tasks.run.dataset import job_of, video_chain


class RunSender:
    """Sends or holds each video of one run in walk order (``add``); ``close`` returns how many there were."""

    def __init__(self, r: redis.Redis, shared: Job, window: int, ttl_s: int, key: bytes | None = None) -> None:
        self.r, self.shared, self.window, self.ttl_s = r, shared, window, ttl_s
        self.holder = completion.holder_of(r, shared.run_id, pending.shared_part(shared), ttl_s)
        self.sealer = seal.Sealer(key, shared) if key is not None else None  # every job sealed with the run's key
        self.count = 0

    def add(self, entry: dict[str, Any]) -> None:
        """Send the video of manifest entry ``entry`` now (within the window) or hold it."""
        text, noun = entry.get("text", ""), entry.get("noun", "")
        sealed = self.sealer.seal(entry["video_id"], entry["path"], text, noun) if self.sealer else ""
        if self.count < self.window:
            job = job_of(self.shared, entry)
            job = dataclasses.replace(job, seal=sealed) if sealed else job
            # Noted just before its send: a video noted long before (a big window on a slow host) would be
            # found nowhere by the sweep, and sent twice.
            completion.note_sent(self.r, [job], self.ttl_s)
            video_chain(job).apply_async()
        else:
            vid, path = entry["video_id"], entry["path"]
            part = [vid, path, text, noun] if text or noun else [vid, path]
            self.holder.add_part([*part, sealed] if sealed else part)
        self.count += 1

    def close(self) -> int:
        """Hold what is buffered; return how many videos the run has."""
        self.holder.close()
        return self.count

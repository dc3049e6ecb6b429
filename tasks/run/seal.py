"""A run's key and the seal on each of its jobs: what a worker takes for the run's own work comes from its disk.

``framefleet enqueue`` makes a random key for each run, OUT/runs/<run_id>.key (mode 0600), before it writes
the run's record and sends anything. Each job it sends or holds carries a seal: an HMAC-SHA256 (first 96
bits, hex) under that key over every field the enqueuer decides (run, roots, chain, settings hashes, GPUs,
modes, and the video's id, path, text and noun). The key never enters Redis: whoever can only write to Redis
cannot make a job its worker takes for the run's, nor change one field of a real one (tasks.pipeline.admission).
The fields the stages add on the way (timings, notes, a failure) are not sealed: they change at each stage.
The statistics callback carries a seal of its own over the run and its output folder.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from tasks.job import Job
from tasks.outputs.storage import atomic_write

KEY_SUFFIX = ".key"
KEY_BYTES = 32
SEAL_CHARS = 24  # hex characters kept of the HMAC: 96 bits (a held video costs ~12 B more in Redis, not 32)
CALLBACK = b"framefleet.aggregate\x00"


def key_path(out_dir: Path, run_id: str) -> Path:
    from tasks.run import runs

    return Path(out_dir) / runs.FOLDER / f"{run_id}{KEY_SUFFIX}"


def create(out_dir: Path, run_id: str) -> bytes:
    """Make the run's key in OUT/runs/<run_id>.key (mode 0600, written atomically); return it."""
    key = os.urandom(KEY_BYTES)

    def write(tmp: Path) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.hex() + "\n")

    path = key_path(out_dir, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write)
    return key


def read_key(out_dir: Path, run_id: str) -> bytes | None:
    """The run's key, or None when the run has none (made by an earlier version). Raises OSError when it
    cannot be read (a worker of another user: PermissionError)."""
    try:
        text = key_path(out_dir, run_id).read_text().strip()
    except FileNotFoundError:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        return None
    return key if len(key) == KEY_BYTES else None


def _shared(job: Job) -> bytes:
    settings = sorted(job.settings.items())
    gpus = None if job.gpus is None else list(job.gpus)
    fields = [job.run_id, job.dataset_root, job.output_root, list(job.chain), gpus, job.force, job.intermediates]
    return json.dumps([*fields, settings], separators=(",", ":")).encode() + b"\x00"


def _video(video_id: str, video: str, text: str, noun: str) -> bytes:
    return json.dumps([video_id, video, text, noun], separators=(",", ":")).encode()


class Sealer:
    """Seals the jobs of one run (``shared``: what they share) under ``key``; the shared part is hashed once."""

    def __init__(self, key: bytes, shared: Job) -> None:
        self._start = hmac.new(key, _shared(shared), hashlib.sha256)

    def seal(self, video_id: str, video: str, text: str = "", noun: str = "") -> str:
        mac = self._start.copy()
        mac.update(_video(video_id, video, text, noun))
        return mac.hexdigest()[:SEAL_CHARS]


_SEALERS: dict[tuple[Any, ...], Sealer] = {}  # a worker's runs' shared parts, hashed once each
SEALERS_KEPT = 64


def seal_of(key: bytes, job: Job) -> str:
    """The seal ``job`` must carry under ``key`` (its run's shared part hashed once per process)."""
    try:
        shared = (key, job.run_id, job.dataset_root, job.output_root, job.chain, job.gpus, job.force)
        ident = (*shared, job.intermediates, tuple(sorted(job.settings.items())))
        sealer = _SEALERS.get(ident)
    except TypeError:  # a field of a kind no enqueue sends (the schema refuses it first): not kept
        ident, sealer = None, None
    if sealer is None:
        sealer = Sealer(key, job)
        if ident is not None:
            if len(_SEALERS) >= SEALERS_KEPT:
                _SEALERS.clear()
            _SEALERS[ident] = sealer
    return sealer.seal(job.video_id, job.video, job.text, job.noun)


def sealed(key: bytes, job: Job) -> Job:
    """``job`` with its seal."""
    import dataclasses

    return dataclasses.replace(job, seal=seal_of(key, job))


def callback_seal(key: bytes, run_id: str, output_root: str) -> str:
    """The seal of the statistics callback of ``run_id`` over ``output_root``."""
    message = CALLBACK + json.dumps([run_id, output_root], separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:SEAL_CHARS]


def matches(given: Any, expected: str) -> bool:
    """Whether the seal ``given`` (from a message: anything) is ``expected``, compared in constant time."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())

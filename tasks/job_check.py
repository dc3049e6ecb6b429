"""The schema a job message must meet before a worker reads or writes anything for it.

Every field a stage may turn into a path, a Redis key or a log line is checked here, once, where
the message enters the worker (tasks.pipeline.task): ids from a safe alphabet, roots absolute and
normalised, the video relative and inside its root after links are resolved, stage names and
settings hashes of the known shapes. A refusal names the field, the rule and the value (as
``repr``, so a newline or a NUL in it cannot forge a log line).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tasks.errors import BadJobMessage, PathOutsideRoot
from tasks.job import Job
from tasks.outputs.storage import confine

MAX_ID = 128  # characters of a video or run id (enqueue makes at most 59 and 22)
MAX_PATH = 4096  # characters of a root or a video path (Linux's PATH_MAX)
MAX_TEXT = 65536  # characters of a video's text or noun
# Letters, digits, "_", "-" and "." but not first: no separator, never "." or "..", no hidden name.
SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
SHA256 = re.compile(r"[0-9a-f]{64}")
SEAL = re.compile(r"[0-9a-f]{24}")  # tasks.run.seal
CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # C0 controls, NUL included, and DEL
INTERMEDIATES = ("keep", "drop")


class JobRefused(BadJobMessage):
    """A job field breaks its rule; ``field`` and ``rule`` say which (the message says both, and the value)."""

    def __init__(self, field: str, rule: str, value: Any) -> None:
        super().__init__(f"job refused: {field} {value!r:.200} {rule}")
        self.field, self.rule = field, rule


class PathRefused(PathOutsideRoot):
    """A job's path field leaves (or is) its root; ``field`` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"job refused: {field}: {reason}")
        self.field, self.rule = field, reason


def shown(value: Any) -> str:
    """``value`` as a log line shows it: itself when it is a safe id, else its ``repr`` (no forged line)."""
    return value if isinstance(value, str) and len(value) <= MAX_ID and SAFE_ID.fullmatch(value) else repr(value)


def check_id(field: str, value: Any) -> str:
    """Return ``value`` if it is a safe id (a file or folder name of its own); raise JobRefused otherwise."""
    if not isinstance(value, str):
        raise JobRefused(field, f"must be a string, not {type(value).__name__}", value)
    if not value or len(value) > MAX_ID:
        raise JobRefused(field, f"must have 1 to {MAX_ID} characters", value)
    if not SAFE_ID.fullmatch(value):
        raise JobRefused(
            field,
            "may hold only letters, digits, '_', '-' and '.' (not first): no path separator, "
            "no control character, never '.' or '..'",
            value,
        )
    return value


def check_root(field: str, value: Any) -> str:
    """Return ``value`` if it is an absolute, normalised folder below ``/``; raise JobRefused otherwise."""
    if not isinstance(value, str) or not value:
        raise JobRefused(field, "must be a non-empty string (an absolute path)", value)
    if len(value) > MAX_PATH or CONTROL.search(value):
        raise JobRefused(field, f"must hold no control character and at most {MAX_PATH} characters", value)
    if not os.path.isabs(value) or os.path.normpath(value) != value or value.startswith("//"):
        raise JobRefused(field, f"must be absolute and normalised (as {os.path.normpath(value)!r} would be)", value)
    if value == "/":
        raise JobRefused(field, "must be a folder below /, not / itself", value)
    return value


def check_text(field: str, value: Any) -> None:
    """Refuse a video's text or noun that is not a string of printable text (tab excepted: no NUL, no newline)."""
    if not isinstance(value, str):
        raise JobRefused(field, f"must be a string, not {type(value).__name__}", value)
    if len(value) > MAX_TEXT or CONTROL.search(value.replace("\t", " ")):
        raise JobRefused(field, f"must hold no control character and at most {MAX_TEXT} characters", value)


def check_job(job: Job, stage: str, stages: tuple[str, ...]) -> Path:
    """Check every field of ``job`` as received by ``stage`` (one of ``stages``, the known ones); return the
    video's resolved path. Raises JobRefused, or PathRefused for a video path outside its root.

    It reads nothing but the links on the way to the video (to resolve them) and writes nothing.
    """
    check_id("run_id", job.run_id)
    check_id("video_id", job.video_id)
    check_root("dataset_root", job.dataset_root)
    check_root("output_root", job.output_root)
    if not isinstance(job.video, str) or not job.video or len(job.video) > MAX_PATH or CONTROL.search(job.video):
        raise JobRefused("video", f"must be a path of 1 to {MAX_PATH} characters without control characters", job.video)
    try:
        video = confine(Path(job.dataset_root), job.video)
    except PathOutsideRoot as exc:
        raise PathRefused("video", str(exc)) from exc
    known = set(stages)
    if stage not in known:
        raise JobRefused("stage", f"is not one of {', '.join(stages)}", stage)
    if not all(isinstance(s, str) and s in known for s in job.chain):
        raise JobRefused("chain", f"must name only stages of {', '.join(stages)}", list(job.chain))
    for name, digest in job.settings.items():
        if name not in known or not isinstance(digest, str) or not SHA256.fullmatch(digest):
            raise JobRefused("settings", "must map known stages to sha256 hex digests", {name: digest})
    for field in ("timings", "notes"):
        if not all(isinstance(s, str) and s in known for s in getattr(job, field)):
            raise JobRefused(field, f"must be keyed by stages of {', '.join(stages)}", list(getattr(job, field)))
    _check_scalars(job)
    return video


def _check_scalars(job: Job) -> None:
    check_text("text", job.text)
    check_text("noun", job.noun)
    if job.intermediates not in INTERMEDIATES:
        raise JobRefused("intermediates", f"must be one of {', '.join(INTERMEDIATES)}", job.intermediates)
    if job.seal and not (isinstance(job.seal, str) and SEAL.fullmatch(job.seal)):
        raise JobRefused("seal", "must be 24 hex digits (the enqueuer's seal) or absent", job.seal)
    if not isinstance(job.force, bool):
        raise JobRefused("force", "must be true or false", job.force)
    if job.gpus is not None and not all(_gpu_index(g) for g in job.gpus):
        raise JobRefused("gpus", "must be null or a list of GPU indices (0 to 1023)", job.gpus)
    for field in ("gpu", "avoid_gpu"):
        value = getattr(job, field)
        if value is not None and not _gpu_index(value):
            raise JobRefused(field, "must be null or a GPU index (0 to 1023)", value)
    if not _number(job.chunk_scale) or not 0 < job.chunk_scale <= 1:
        raise JobRefused("chunk_scale", "must be a number above 0 and at most 1", job.chunk_scale)
    if not _number(job.oom_peak_mib) or job.oom_peak_mib < 0:
        raise JobRefused("oom_peak_mib", "must be a number of MiB, 0 or more", job.oom_peak_mib)
    if not isinstance(job.claim_waits, int) or isinstance(job.claim_waits, bool) or job.claim_waits < 0:
        raise JobRefused("claim_waits", "must be a count, 0 or more", job.claim_waits)
    for field in ("notes", "report"):
        value = getattr(job, field)
        if value is not None and not isinstance(value, Mapping):
            raise JobRefused(field, "must be a JSON object", value)


def _gpu_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1024


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

"""The one exception hierarchy: retry and quarantine logic read only the type."""

from __future__ import annotations


class FramefleetError(Exception):
    """Base of every error framefleet raises on purpose."""


class PermanentError(FramefleetError):
    """Retrying cannot help; the video fails (or is quarantined) at once."""


class BadInput(PermanentError):
    """The input video or a stage input is unusable: corrupt, empty, flat, too short."""


class ModelLoadError(PermanentError):
    """A stage's model could not be loaded; the worker must not consume tasks."""


class UnknownBackend(PermanentError):
    """A stage was configured with a backend name that does not exist."""


class PathOutsideRoot(PermanentError):
    """A path named in a message leaves the dataset or output root."""


class BadJobMessage(PermanentError):
    """A job message lacks a key it needs or holds a value of the wrong kind (tasks.job)."""


class RetryableError(FramefleetError):
    """A transient failure; the task is retried after ``delay_s`` seconds."""

    def __init__(self, message: str, delay_s: float = 5.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class GpuOutOfMemory(RetryableError):
    """CUDA ran out of memory; retry with backoff, preferably elsewhere, with smaller chunks."""


class TransientIO(RetryableError):
    """A file system or broker hiccup that may pass."""


class RedisUnavailable(RetryableError):
    """Redis (the broker or framefleet's own keys) did not answer; the task is retried when it may be back."""


class ClaimLost(FramefleetError):
    """Another run now holds this video's stage (ours lapsed: a host cut off or paused past the lease TTL);
    this run must publish nothing and continue nothing."""


class ClaimUnconfirmed(RetryableError):
    """Redis could not be asked whether this run still holds its claim, so its output was not published."""


class LowQuality(PermanentError):
    """A video measured below a quality gate (tasks.pipeline.quality); ``detail``: each measure, value, threshold."""

    kind = "low_quality"

    def __init__(self, message: str, detail: dict | None = None) -> None:
        super().__init__(message)
        self.detail = detail or {}


def error_class(exc: BaseException) -> str:
    """Return the short name recorded in failure records and quarantine entries (the class name, or its ``kind``)."""
    return str(getattr(type(exc), "kind", type(exc).__name__))


class WorkerLost(PermanentError):
    """A task was started too many times without finishing: its worker died or hit the deadline."""


def as_framefleet_error(exc: Exception) -> FramefleetError | Exception:
    """The framefleet error that ``exc``, raised by a stage, stands for (``exc`` itself when none does)."""
    # torch is not imported here; its OOM error is recognised by name.
    if type(exc).__name__ == "OutOfMemoryError":
        return GpuOutOfMemory(str(exc).splitlines()[0] if str(exc) else "CUDA out of memory", 10.0)
    if isinstance(exc, OSError) and not isinstance(exc, FramefleetError):
        where = f" {exc.filename}" if exc.filename else ""
        return TransientIO(
            f"cannot read or write{where}: {exc.strerror or exc} (a full disk, a read-only "
            "or unmounted output folder, or a file in the way); retrying",
            10.0,
        )
    return exc

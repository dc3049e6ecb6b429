"""The one exception hierarchy: retry and quarantine logic read only the type; a stage's own error (a GPU
out-of-memory in any of torch's forms, an OSError) is mapped onto it here."""

from __future__ import annotations

import re

# The exit status of a worker that cannot serve at all (a model that cannot load): its supervisor does not
# restart it, since a restart would fail the same way.
EXIT_CANNOT_START = 3


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


class DatasetError(FramefleetError):
    """The input or output folder cannot be used; the message says why and what to do."""


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


# What torch's messages say when a CUDA library could not get device memory (torch 2.x; sources cited per line).
OOM_MESSAGES = re.compile(
    "|".join(
        (
            r"CUDA out of memory",  # the caching allocator (torch.OutOfMemoryError; a RuntimeError before 1.13)
            r"CUDA error: out of memory",  # C10_CUDA_CHECK of cudaErrorMemoryAllocation (torch.AcceleratorError)
            r"CUDA driver error: out of memory",  # AT_CUDA_DRIVER_CHECK of CUDA_ERROR_OUT_OF_MEMORY
            r"CUBLAS_STATUS_ALLOC_FAILED",  # TORCH_CUDABLAS_CHECK: "CUDA error: CUBLAS_... when calling `...`"
            r"CUSOLVER_STATUS_ALLOC_FAILED",  # TORCH_CUSOLVER_CHECK: "cusolver error: CUSOLVER_..., when calling"
            r"CUSPARSE_STATUS_ALLOC_FAILED",  # TORCH_CUDASPARSE_CHECK
            r"CUFFT_ALLOC_FAILED",  # CUFFT_CHECK: "cuFFT error: CUFFT_ALLOC_FAILED"
            r"CUDNN_STATUS_ALLOC_FAILED",  # AT_CUDNN_CHECK, cuDNN 8: "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"
            r"CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",  # AT_CUDNN_CHECK, cuDNN 9
        )
    )
)
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation: torch.AcceleratorError's error_code for an OOM


def is_gpu_oom(exc: BaseException) -> bool:
    """True when ``exc``, or an exception it was raised from, is a GPU out-of-memory error in any of torch's forms.

    By type: torch.OutOfMemoryError (and the fake GPU's, named alike) and a torch.AcceleratorError whose
    ``error_code`` is cudaErrorMemoryAllocation; by message: cuBLAS, cuSOLVER, cuSPARSE, cuFFT and cuDNN
    allocation failures and the CUDA runtime's and driver's "out of memory", which torch raises as plain
    RuntimeError. A host's MemoryError or torch's CPU allocator failing is not a GPU OOM, nor is a full Redis
    (redis-py's OutOfMemoryError, a ResponseError: the name alone would take it for one).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = {cls.__name__ for cls in type(current).__mro__}
        if "OutOfMemoryError" in names and isinstance(current, RuntimeError):  # torch's, the fake GPU's; not redis-py's
            return True
        if "AcceleratorError" in names and getattr(current, "error_code", None) == CUDA_ERROR_MEMORY_ALLOCATION:
            return True
        if isinstance(current, RuntimeError) and OOM_MESSAGES.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def as_framefleet_error(exc: Exception) -> FramefleetError | Exception:
    """The framefleet error that ``exc``, raised by a stage, stands for (``exc`` itself when none does)."""
    if not isinstance(exc, GpuOutOfMemory) and is_gpu_oom(exc):  # torch is not imported: by names and messages
        return GpuOutOfMemory(str(exc).splitlines()[0] if str(exc) else "CUDA out of memory", 10.0)
    if isinstance(exc, OSError) and not isinstance(exc, FramefleetError):
        where = f" {exc.filename}" if exc.filename else ""
        return TransientIO(
            f"cannot read or write{where}: {exc.strerror or exc} (a full disk, a read-only "
            "or unmounted output folder, or a file in the way); retrying",
            10.0,
        )
    return exc

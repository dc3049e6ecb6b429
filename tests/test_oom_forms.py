"""Every form in which torch reports a GPU out-of-memory becomes GpuOutOfMemory (retried elsewhere, smaller chunks);
other CUDA errors and host memory errors do not.

torch here is the CPU build, so each error is raised as torch raises it on a GPU: the same class
(torch.OutOfMemoryError, torch.AcceleratorError with its ``error_code``, RuntimeError for the
libraries' TORCH_CHECKs) and the message torch builds, from torch's sources at the lines cited.
"""

from __future__ import annotations

import pytest
import redis
import torch

from tasks.errors import BadInput, ClaimUnconfirmed, GpuOutOfMemory, is_gpu_oom
from tasks.errors import as_framefleet_error as _as_framefleet_error
from tasks.gpu.fake import OutOfMemoryError as FakeOutOfMemoryError
from tasks.pipeline.oom import stage_peak_mib

# c10/cuda/CUDAException.cpp c10_cuda_check_implementation: "CUDA error: " + cudaGetErrorString + help + suffix
CHECK_SUFFIX = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
    "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def accelerator_error(message: str, code: int) -> torch.AcceleratorError:
    """As torch/csrc/Exceptions.cpp _new_accelerator_error_object builds it: the message, then ``error_code``."""
    exc = torch.AcceleratorError(message)
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


OOM_FORMS = {
    # c10/cuda/CUDACachingAllocator.cpp, raised as torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)
    "caching allocator": torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
        "1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in use."
    ),
    "the fake GPU": FakeOutOfMemoryError("CUDA out of memory. Tried to allocate 4000.00 MiB. GPU 0 ..."),
    # cudaErrorMemoryAllocation (2) from a CUDA runtime call: torch.AcceleratorError since torch 2.8
    "CUDA runtime": accelerator_error("CUDA error: out of memory" + CHECK_SUFFIX, 2),
    # the same from torch before 2.8: a RuntimeError
    "CUDA runtime, torch < 2.8": RuntimeError("CUDA error: out of memory" + CHECK_SUFFIX),
    # aten/src/ATen/cuda/Exceptions.h AT_CUDA_DRIVER_CHECK with CUDA_ERROR_OUT_OF_MEMORY
    "CUDA driver": RuntimeError("CUDA driver error: out of memory"),
    # aten/src/ATen/cuda/Exceptions.h TORCH_CUDABLAS_CHECK (the handle pool's first cuBLAS call on a full GPU)
    "cuBLAS": RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    # aten/src/ATen/cuda/Exceptions.h TORCH_CUSOLVER_CHECK
    "cuSOLVER": RuntimeError(
        "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`. If you keep "
        "seeing this error, you may use `torch.backends.cuda.preferred_linalg_library()` to try linear algebra "
        "operators with other supported backends."
    ),
    # aten/src/ATen/native/cuda/CuFFTUtils.h CUFFT_CHECK
    "cuFFT": RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"),
    # aten/src/ATen/cuda/Exceptions.h AT_CUDNN_CHECK: c10::CuDNNError, a RuntimeError in Python; cuDNN 8 and 9 names
    "cuDNN 8": RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    "cuDNN 9": RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
}

NOT_OOM = {
    # an illegal access is sticky and fatal to the context: not something a smaller chunk fixes
    "illegal address": accelerator_error("CUDA error: an illegal memory access was encountered" + CHECK_SUFFIX, 700),
    "cuBLAS execution": RuntimeError(
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, ...)`"
    ),
    "cuDNN internal": RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
    "cuDNN unsupported": RuntimeError(
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."
    ),
    "host memory": MemoryError("Unable to allocate 315. MiB for an array with shape (21, 1024, 1280, 3)"),
    "a model's own error": ValueError("expected 3 channels, got 4"),
    # redis-py's class for Redis's "OOM command not allowed when used memory > 'maxmemory'": a full Redis
    "a full Redis": redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
}


def raised(exc: BaseException) -> BaseException:
    """``exc`` as an except clause receives it: raised, with its traceback."""
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize("form", sorted(OOM_FORMS))
def test_each_form_of_gpu_oom_becomes_a_retryable_gpu_oom(form):
    exc = raised(OOM_FORMS[form])
    assert is_gpu_oom(exc)
    failure = _as_framefleet_error(exc)
    assert isinstance(failure, GpuOutOfMemory) and str(failure) == str(exc).splitlines()[0]


@pytest.mark.parametrize("form", sorted(NOT_OOM))
def test_other_cuda_and_host_errors_are_not_taken_for_gpu_oom(form):
    exc = raised(NOT_OOM[form])
    assert not is_gpu_oom(exc)
    assert not isinstance(_as_framefleet_error(exc), GpuOutOfMemory)


def test_torch_s_own_cpu_allocator_failure_is_not_a_gpu_oom():
    with pytest.raises(RuntimeError) as caught:
        torch.empty(1 << 62, dtype=torch.uint8)  # raised by torch itself: DefaultCPUAllocator, host memory
    assert not is_gpu_oom(caught.value)


def test_an_oom_a_backend_wrapped_in_its_own_error_is_still_an_oom():
    def backend() -> None:
        try:
            raise OOM_FORMS["cuBLAS"]
        except RuntimeError as exc:
            raise BadInput("depth model failed on frame 12") from exc

    with pytest.raises(BadInput) as caught:
        backend()
    assert isinstance(_as_framefleet_error(caught.value), GpuOutOfMemory)


def test_the_peak_a_message_reports_is_read_from_torch_s_wording():
    exc = raised(OOM_FORMS["caching allocator"])
    assert stage_peak_mib(object(), str(exc)) == 2048.0


def test_a_claim_unconfirmed_because_redis_is_full_is_not_a_gpu_oom():
    """The fence before publishing, when Redis refuses to take the lapsed claim back: retried as what it is, not
    with halved chunks on another GPU (a worker whose Redis filled up mid-task logged GpuOutOfMemory)."""
    unconfirmed = ClaimUnconfirmed("cannot confirm the claim ff:claim:x before publishing", 10.0)
    unconfirmed.__cause__ = raised(NOT_OOM["a full Redis"])  # as claims.confirm raises it: ``from`` Redis's refusal
    caught = raised(unconfirmed)
    assert not is_gpu_oom(caught) and _as_framefleet_error(caught) is caught

"""The real GPUs, read through NVML (nvidia-ml-py): no CUDA context, so reading never touches CUDA."""

from __future__ import annotations

import os
from typing import Any

from tasks.errors import FramefleetError
from tasks.gpu.readings import MIB, GpuReading, ProcessReading


class NvmlUnavailable(FramefleetError):
    """NVML could not be initialised: no driver, no library, or no permission."""


class NvmlProbe:
    """The real GPUs, read through NVML (nvidia-ml-py); raises NvmlUnavailable when NVML cannot start.

    ``nvml``: what answers the NVML calls, pynvml by default (tasks.gpu.fake.FakeNvml answers them from a ledger).
    """

    mode = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml as real

            nvml = real
        pynvml = self._nvml = nvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML could not be initialised ({exc}); install the NVIDIA driver (libnvidia-ml.so.1) "
                "or run where a GPU is visible, or use a fake GPU ledger ($FRAMEFLEET_FAKE_GPU)"
            ) from exc
        self._open = True
        try:
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(f"NVML started but could not list the GPUs ({exc})") from exc

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def uuids(self) -> list[str]:
        """The UUIDs ("GPU-…") of the GPUs, in NVML index order."""
        return [_text(self._nvml.nvmlDeviceGetUUID(handle)) for handle in self._handles]

    def gpus(self) -> list[GpuReading]:
        nvml = self._nvml
        readings = []
        for index, handle in enumerate(self._handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            readings.append(
                GpuReading(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    total_mib=memory.total / MIB,
                    used_mib=memory.used / MIB,
                    free_mib=memory.free / MIB,
                    utilization_pct=self._utilization(handle),
                )
            )
        return readings

    def processes(self) -> list[ProcessReading]:
        readings = []
        for index, handle in enumerate(self._handles):
            for proc in self._compute_processes(handle):
                used = proc.usedGpuMemory  # None where the driver cannot tell (Windows WDDM)
                readings.append(ProcessReading(pid=int(proc.pid), gpu=index, used_mib=(used or 0) / MIB))
        return readings

    def close(self) -> None:
        if self._open:
            self._open = False
            self._nvml.nvmlShutdown()

    def _utilization(self, handle: Any) -> float:
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except self._nvml.NVMLError_NotSupported:
            return 0.0  # MIG instances and some virtual GPUs do not report it

    def _compute_processes(self, handle: Any) -> list[Any]:
        nvml = self._nvml
        try:
            return nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLLibraryMismatchError:
            # A driver older than this nvidia-ml-py lacks the _v3 entry point.
            return nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)


def uuid_of_visible_device() -> str | None:
    """Return the NVML UUID ("GPU-…") of the physical GPU that ``CUDA_VISIBLE_DEVICES``'s first entry
    names (an index or a UUID or unique UUID prefix; unset means index 0), for a worker to check its
    pinning; None without NVML, or when the entry names no GPU (empty, "-1", a MIG instance, unknown).

    An index is read in NVML's (PCI bus) order, which is CUDA's when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    and, on a host of identical GPUs, CUDA's default order too.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entry = "0" if visible is None else visible.split(",")[0].strip()
    try:
        probe = NvmlProbe()
    except NvmlUnavailable:
        return None
    try:
        uuids = probe.uuids()
    finally:
        probe.close()
    if entry.isdigit():
        return uuids[int(entry)] if int(entry) < len(uuids) else None
    if entry.startswith("GPU-"):
        matches = [u for u in uuids if u.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value

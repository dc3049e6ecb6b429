"""GPU readings from NVML, from a fake GPU ledger, or none: one interface, ``GpuProbe``, chosen by ``open_probe``.

Nothing here imports torch or initialises CUDA: NVML needs no CUDA context.
"""

from __future__ import annotations

import os

from tasks.gpu.fake import INDEX_ENV, LEDGER_ENV, FakeGpuLedger, FakeProbe
from tasks.gpu.nvml import NvmlProbe, NvmlUnavailable, uuid_of_visible_device
from tasks.gpu.readings import GpuProbe, GpuReading, NoGpuProbe, ProcessReading

__all__ = [
    "INDEX_ENV",
    "LEDGER_ENV",
    "FakeGpuLedger",
    "FakeProbe",
    "GpuProbe",
    "GpuReading",
    "NoGpuProbe",
    "NvmlProbe",
    "NvmlUnavailable",
    "ProcessReading",
    "open_probe",
    "uuid_of_visible_device",
]


def open_probe(fake_path: str | os.PathLike[str] | None = None) -> GpuProbe:
    """Return a FakeProbe for ``fake_path`` (else ``$FRAMEFLEET_FAKE_GPU``), else an NvmlProbe with at
    least one GPU, else a NoGpuProbe; never raises for a machine without a GPU."""
    fake_path = fake_path or os.environ.get(LEDGER_ENV)
    if fake_path:
        return FakeProbe(fake_path)
    try:
        probe = NvmlProbe()
    except NvmlUnavailable as exc:
        return NoGpuProbe(str(exc))
    if not probe.device_count:
        probe.close()
        return NoGpuProbe("NVML sees no GPU")
    return probe

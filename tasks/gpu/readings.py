"""What a GPU probe reads: GPUs and per-process memory, and the probe interface NVML and the fake share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

MIB = 1 << 20


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment; memory in MiB, utilisation in percent of the last sample period."""

    index: int
    uuid: str
    name: str
    total_mib: float
    used_mib: float
    free_mib: float
    utilization_pct: float


@dataclass(frozen=True)
class ProcessReading:
    """One compute process's memory on one GPU (MiB); ``gpu`` is the NVML index."""

    pid: int
    gpu: int
    used_mib: float


class GpuProbe(Protocol):
    mode: str  # "nvml" | "fake" | "none"

    def gpus(self) -> list[GpuReading]: ...

    def processes(self) -> list[ProcessReading]: ...

    def close(self) -> None: ...


class NoGpuProbe:
    """No GPU to read (no NVML, or no device); ``reason`` says which."""

    mode = "none"

    def __init__(self, reason: str = "no GPU visible") -> None:
        self.reason = reason

    def gpus(self) -> list[GpuReading]:
        return []

    def processes(self) -> list[ProcessReading]:
        return []

    def close(self) -> None:
        pass

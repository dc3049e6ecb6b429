"""A fake GPU of equal standing beside NVML: a JSON ledger of per-process allocations, shared by processes.

Tests script it (GPU sizes, the threshold at which allocations fail) and the synthetic backends
allocate on it, so packing, OOM and the GPU memory tool can be exercised on a machine without a GPU.
File layout::

    {"gpus": [{"index": 0, "uuid": "GPU-fake-0", "name": "Fake GPU 24GB", "total_mib": 24576,
               "oom_at_mib": 24576, "utilization_pct": 0}],
     "allocations": {"<pid>": {"<gpu>": mib}},
     "computing": {"<pid>": {"<gpu>": pct}}}

Utilisation is a model of time-slicing: a GPU's ``utilization_pct`` (what other programs keep it busy) plus the
share each live process computing on it asks for (``computing``), at most 100, as NVML's
``nvmlDeviceGetUtilizationRates(handle).gpu`` reports it (``FakeNvml`` answers those calls from the ledger).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tasks.gpu.readings import MIB, GpuReading, ProcessReading

LEDGER_ENV = "FRAMEFLEET_FAKE_GPU"
INDEX_ENV = "FRAMEFLEET_FAKE_GPU_INDEX"


class OutOfMemoryError(RuntimeError):
    """An allocation on the fake GPU passed its ``oom_at_mib``; named like ``torch.cuda.OutOfMemoryError``
    so that code classifying errors by class name treats both alike."""


FakeCudaOutOfMemory = OutOfMemoryError


class FakeGpuLedger:
    """The ledger file at ``path``; every read-modify-write holds an exclusive lock on ``path + '.lock'``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    @classmethod
    def create(cls, path: str | os.PathLike[str], gpus: list[dict[str, Any]]) -> FakeGpuLedger:
        """Write a ledger of ``gpus`` with no allocations; each dict needs ``total_mib`` (MiB).

        Missing keys default to: ``index`` its position, ``uuid`` "GPU-fake-<index>", ``name``
        "Fake GPU", ``oom_at_mib`` = ``total_mib``, ``utilization_pct`` 0. Raises ValueError.
        """
        filled = []
        for position, gpu in enumerate(gpus):
            if "total_mib" not in gpu or float(gpu["total_mib"]) <= 0:
                raise ValueError(f"fake GPU #{position} needs total_mib > 0, got {gpu!r}")
            index = int(gpu.get("index", position))
            filled.append(
                {
                    "index": index,
                    "uuid": str(gpu.get("uuid", f"GPU-fake-{index}")),
                    "name": str(gpu.get("name", "Fake GPU")),
                    "total_mib": float(gpu["total_mib"]),
                    "oom_at_mib": float(gpu.get("oom_at_mib", gpu["total_mib"])),
                    "utilization_pct": float(gpu.get("utilization_pct", 0)),
                }
            )
        ledger = cls(path)
        with ledger._locked():
            ledger._write({"gpus": filled, "allocations": {}})
        return ledger

    def allocate(self, gpu: int, mib: float, pid: int | None = None) -> float:
        """Add ``mib`` MiB on ``gpu`` for ``pid`` (default: this process); return that pid's MiB on it after.

        Raises OutOfMemoryError when the GPU's used memory plus ``mib`` exceeds its ``oom_at_mib``,
        ValueError for an unknown GPU or a negative size.
        """
        if mib < 0:
            raise ValueError(f"cannot allocate a negative size: {mib} MiB")
        pid = os.getpid() if pid is None else pid
        with self._locked():
            data = self._read_pruned()
            spec = _gpu(data, gpu, self.path)
            used = _used_mib(data, gpu)
            if used + mib > spec["oom_at_mib"]:
                raise OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {mib:.2f} MiB. GPU {gpu} has a total capacity of "
                    f"{spec['total_mib'] / 1024:.2f} GiB of which {max(0.0, spec['oom_at_mib'] - used):.2f} MiB "
                    f"is free. Process {pid} has {_own_mib(data, pid, gpu):.2f} MiB memory in use. "
                    f"(fake GPU ledger {self.path}: {used:.2f} MiB in use, allocations fail above "
                    f"{spec['oom_at_mib']:.2f} MiB)"
                )
            per_gpu = data["allocations"].setdefault(str(pid), {})
            per_gpu[str(gpu)] = per_gpu.get(str(gpu), 0.0) + float(mib)
            self._write(data)
            return per_gpu[str(gpu)]

    def free(self, gpu: int, mib: float, pid: int | None = None) -> None:
        """Give back ``mib`` MiB of ``pid``'s memory on ``gpu`` (never below zero)."""
        pid = os.getpid() if pid is None else pid
        with self._locked():
            data = self._read_pruned()
            per_gpu = data["allocations"].get(str(pid), {})
            left = per_gpu.get(str(gpu), 0.0) - float(mib)
            if left > 1e-9:
                per_gpu[str(gpu)] = left
            else:
                per_gpu.pop(str(gpu), None)
            if not per_gpu:
                data["allocations"].pop(str(pid), None)
            self._write(data)

    def release(self, pid: int) -> None:
        """Drop every allocation of ``pid``, as the driver does when a process ends."""
        with self._locked():
            data = self._read_pruned()
            data["allocations"].pop(str(pid), None)
            self._write(data)

    def set_computing(self, gpu: int, pct: float, pid: int | None = None) -> None:
        """Say that ``pid`` (default: this process) now keeps ``pct`` percent of ``gpu``'s time busy (0: idle)."""
        if not 0 <= pct <= 100:
            raise ValueError(f"a process's compute share is a percentage of the GPU's time, 0-100: got {pct}")
        pid = os.getpid() if pid is None else pid
        with self._locked():
            data = self._read_pruned()
            _gpu(data, gpu, self.path)
            per_gpu = data.setdefault("computing", {}).setdefault(str(pid), {})
            per_gpu[str(gpu)] = float(pct)
            self._write(data)

    def set_oom_at(self, gpu: int, mib: float) -> None:
        """Make allocations on ``gpu`` fail once its used memory would pass ``mib`` MiB."""
        with self._locked():
            data = self._read()
            _gpu(data, gpu, self.path)["oom_at_mib"] = float(mib)
            self._write(data)

    def readings(self) -> tuple[list[GpuReading], list[ProcessReading]]:
        """Return the GPUs and the per-process allocations, after dropping processes that have ended."""
        with self._locked():
            data = self._read_pruned(write=True)
        gpus = []
        for spec in data["gpus"]:
            used = _used_mib(data, spec["index"])
            gpus.append(
                GpuReading(
                    index=spec["index"],
                    uuid=spec["uuid"],
                    name=spec["name"],
                    total_mib=spec["total_mib"],
                    used_mib=used,
                    free_mib=max(0.0, spec["total_mib"] - used),
                    utilization_pct=_utilization_pct(data, spec),
                )
            )
        processes = [
            ProcessReading(pid=int(pid), gpu=int(gpu), used_mib=mib)
            for pid, per_gpu in data["allocations"].items()
            for gpu, mib in per_gpu.items()
            if mib > 0
        ]
        processes.sort(key=lambda p: (p.gpu, p.pid))
        return gpus, processes

    @contextlib.contextmanager
    def held(self, gpu: int, mib: float, pid: int | None = None) -> Iterator[float]:
        """Allocate ``mib`` on ``gpu`` for the block and free it after; yields the pid's MiB on it meanwhile."""
        own = self.allocate(gpu, mib, pid)
        try:
            yield own
        finally:
            self.free(gpu, mib, pid)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no fake GPU ledger at {self.path}; create it with FakeGpuLedger.create(path, gpus) "
                f"or unset ${LEDGER_ENV}"
            ) from None

    def _read_pruned(self, write: bool = False) -> dict[str, Any]:
        data = self._read()
        computing = data.setdefault("computing", {})
        dead = [pid for pid in {*data["allocations"], *computing} if not _alive(int(pid))]
        for pid in dead:
            data["allocations"].pop(pid, None)
            computing.pop(pid, None)
        if dead and write:
            self._write(data)
        return data

    def _write(self, data: dict[str, Any]) -> None:
        # Readers that skip the lock still never see a torn file.
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)


@dataclass(frozen=True)
class FakeGpuSlot:
    """One GPU of a ledger, as the process pinned to it sees it."""

    ledger: FakeGpuLedger
    gpu: int

    def allocate(self, mib: float) -> float:
        return self.ledger.allocate(self.gpu, mib)

    def held(self, mib: float) -> contextlib.AbstractContextManager[float]:
        return self.ledger.held(self.gpu, mib)


def slot_from_env(environ: Mapping[str, str] = os.environ) -> FakeGpuSlot | None:
    """Return the fake GPU this process is pinned to: ``$FRAMEFLEET_FAKE_GPU`` names the ledger and
    ``$FRAMEFLEET_FAKE_GPU_INDEX`` the GPU; None unless both are set. Raises ValueError for a bad index."""
    path, index = environ.get(LEDGER_ENV), environ.get(INDEX_ENV)
    if not path or index is None or index == "":
        return None
    if not index.strip().isdigit():
        raise ValueError(f"${INDEX_ENV} must be a GPU index such as 0, got {index!r}")
    return FakeGpuSlot(FakeGpuLedger(path), int(index))


class FakeProbe:
    """GPUs and processes from a fake GPU ledger ; the ledger file must exist."""

    mode = "fake"

    def __init__(self, ledger: FakeGpuLedger | str | os.PathLike[str]) -> None:
        self.ledger = ledger if isinstance(ledger, FakeGpuLedger) else FakeGpuLedger(ledger)

    def gpus(self) -> list[GpuReading]:
        return self.ledger.readings()[0]

    def processes(self) -> list[ProcessReading]:
        return self.ledger.readings()[1]

    def close(self) -> None:
        pass


class FakeNvml:
    """The NVML calls ``tasks.gpu.nvml.NvmlProbe`` makes, answered from a fake GPU ledger: ``NvmlProbe(FakeNvml(path))``
    reads a ledger through the same code as a real GPU (a handle is the GPU's index)."""

    NVMLError = RuntimeError
    NVMLError_NotSupported = NotImplementedError
    NVMLLibraryMismatchError = LookupError

    def __init__(self, ledger: FakeGpuLedger | str | os.PathLike[str]) -> None:
        self.ledger = ledger if isinstance(ledger, FakeGpuLedger) else FakeGpuLedger(ledger)

    def nvmlInit(self) -> None:  # noqa: N802  (NVML's names)
        self.ledger.readings()

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.ledger.readings()[0])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        g = self._gpu(handle)
        return SimpleNamespace(total=int(g.total_mib * MIB), used=int(g.used_mib * MIB), free=int(g.free_mib * MIB))

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=round(self._gpu(handle).utilization_pct), memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:  # noqa: N802
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=int(p.used_mib * MIB))
            for p in self.ledger.readings()[1]
            if p.gpu == handle
        ]

    def _gpu(self, handle: int) -> GpuReading:
        return self.ledger.readings()[0][handle]


def _gpu(data: dict[str, Any], gpu: int, path: Path) -> dict[str, Any]:
    for spec in data["gpus"]:
        if spec["index"] == gpu:
            return spec
    raise ValueError(f"the fake GPU ledger {path} has no GPU {gpu}; its GPUs are {[g['index'] for g in data['gpus']]}")


def _used_mib(data: dict[str, Any], gpu: int) -> float:
    return float(sum(per_gpu.get(str(gpu), 0.0) for per_gpu in data["allocations"].values()))


def _utilization_pct(data: dict[str, Any], spec: dict[str, Any]) -> float:
    """The GPU's busy percentage: what others keep busy plus each computing process's share, at most 100."""
    shares = sum(per_gpu.get(str(spec["index"]), 0.0) for per_gpu in data.get("computing", {}).values())
    return min(100.0, float(spec["utilization_pct"]) + shares)


def _own_mib(data: dict[str, Any], pid: int, gpu: int) -> float:
    return float(data["allocations"].get(str(pid), {}).get(str(gpu), 0.0))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True

"""GPU probes: the fake ledger shared by real processes, the choice of probe, NVML on a real GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pynvml
import pytest

from tasks.gpu import (
    GpuReading,
    NoGpuProbe,
    NvmlProbe,
    NvmlUnavailable,
    ProcessReading,
    fake,
    open_probe,
    uuid_of_visible_device,
)
from tasks.gpu.fake import FakeGpuLedger
from tests.conftest import ROOT, wait_until

pytestmark = pytest.mark.timeout(60)

HOLDER = """
import sys
from tasks.gpu.fake import FakeGpuLedger
ledger = FakeGpuLedger(sys.argv[1])
for spec in sys.argv[2:]:
    if spec == "wait":  # start together with the other holders
        print("waiting", flush=True)
        sys.stdin.readline()
        continue
    gpu, mib, times = (float(x) for x in spec.split(":"))
    for _ in range(int(times)):
        ledger.allocate(int(gpu), mib)
print("ready", flush=True)
sys.stdin.read()  # hold the memory until the test closes stdin
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


class Holder:
    """A real process that allocates on the ledger, then holds its memory until stopped."""

    def __init__(self, ledger: Path, *specs: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(ledger), *specs],
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid

    def ready(self) -> Holder:
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", self.proc.stderr.read()
        return self

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)  # reaped: os.kill(pid, 0) now fails as for any ended process
        self.proc.stdout.close()
        self.proc.stderr.close()


def nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture
def ledger(tmp_path: Path) -> FakeGpuLedger:
    return FakeGpuLedger.create(
        tmp_path / "gpus.json",
        [
            {"name": "Fake GPU 24GB", "total_mib": 24576, "oom_at_mib": 20000, "utilization_pct": 35},
            {"uuid": "GPU-fake-other", "total_mib": 12288},
        ],
    )


def test_allocations_of_two_processes_add_up_and_fail_at_the_scripted_threshold(ledger):
    a = Holder(ledger.path, "0:1000:1", "1:500:1")
    b = Holder(ledger.path, "0:3000:1")
    try:
        a.ready(), b.ready()
        gpus, procs = ledger.readings()
        assert gpus[0] == GpuReading(0, "GPU-fake-0", "Fake GPU 24GB", 24576, 4000, 20576, 35)
        assert gpus[1] == GpuReading(1, "GPU-fake-other", "Fake GPU", 12288, 500, 11788, 0)
        assert sorted(procs, key=lambda p: (p.gpu, p.used_mib)) == [
            ProcessReading(a.pid, 0, 1000),
            ProcessReading(b.pid, 0, 3000),
            ProcessReading(a.pid, 1, 500),
        ]

        assert ledger.allocate(0, 16000) == 16000  # exactly up to oom_at_mib (20000) still fits
        with pytest.raises(fake.OutOfMemoryError) as caught:
            ledger.allocate(0, 1)
        assert type(caught.value).__name__ == "OutOfMemoryError" and isinstance(caught.value, RuntimeError)
        assert fake.FakeCudaOutOfMemory is fake.OutOfMemoryError
        message = str(caught.value)
        assert message.startswith(
            "CUDA out of memory. Tried to allocate 1.00 MiB. GPU 0 has a total capacity of 24.00 GiB"
        )
        assert f"Process {os.getpid()} has 16000.00 MiB memory in use" in message
        assert ledger.readings()[0][0].used_mib == 20000  # the failed allocation left nothing behind
        ledger.free(0, 16000)

        ledger.set_oom_at(1, 1000)  # GPU 1 holds 500 of process a
        third = subprocess.run(
            [sys.executable, "-c", HOLDER, str(ledger.path), "1:600:1"],
            cwd=ROOT,
            input="",
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert third.returncode != 0
        assert "fake.OutOfMemoryError: CUDA out of memory. Tried to allocate 600.00 MiB. GPU 1" in third.stderr
    finally:
        a.stop(), b.stop()


def test_concurrent_processes_lose_no_allocation(ledger):
    holders = [Holder(ledger.path, "wait", "0:1:100", "1:0.5:100") for _ in range(3)]
    try:
        for h in holders:
            assert h.proc.stdout.readline() == "waiting\n"
        for h in holders:
            h.proc.stdin.write("go\n")
            h.proc.stdin.flush()
        for h in holders:
            h.ready()
        gpus, procs = ledger.readings()
        assert (gpus[0].used_mib, gpus[1].used_mib) == (300, 150)
        assert sorted(p.used_mib for p in procs) == [0.5 * 100] * 3 + [100] * 3
    finally:
        for h in holders:
            h.stop()


def test_processes_that_ended_are_pruned(ledger):
    holder = Holder(ledger.path, "0:2000:1", "1:100:1").ready()
    ledger.allocate(0, 100)
    assert {p.pid for p in ledger.readings()[1]} == {holder.pid, os.getpid()}
    holder.stop()
    gpus, procs = ledger.readings()
    assert procs == [ProcessReading(os.getpid(), 0, 100)]
    assert (gpus[0].used_mib, gpus[1].used_mib) == (100, 0)
    assert str(holder.pid) not in ledger.path.read_text()  # written back, not only filtered
    ledger.release(os.getpid())
    assert ledger.readings()[1] == []


def test_held_frees_after_the_block_even_when_it_raises(ledger):
    ledger.allocate(0, 300)
    with pytest.raises(ValueError, match="inside"), ledger.held(0, 700) as own:
        assert own == 1000 and ledger.readings()[0][0].used_mib == 1000
        raise ValueError("inside")
    assert ledger.readings()[1] == [ProcessReading(os.getpid(), 0, 300)]
    with pytest.raises(ValueError, match=r"no GPU 7; its GPUs are \[0, 1\]"):
        ledger.allocate(7, 1)


def test_the_synthetic_models_allocate_on_the_fake_gpu_they_are_pinned_to(ledger, monkeypatch):
    import numpy as np

    from tasks.backends.synthetic import SyntheticDepth

    monkeypatch.setenv(fake.LEDGER_ENV, str(ledger.path))
    monkeypatch.setenv(fake.INDEX_ENV, "1")
    # Small sizes: on the CPU the same amounts are really allocated by torch too.
    model = SyntheticDepth(hold_mib=40, activation_mib=15, matmuls_per_frame=0)
    model.load("cpu")
    assert ledger.readings()[1] == [ProcessReading(os.getpid(), 1, 40)]
    frames = np.random.default_rng(0).integers(0, 255, (2, 32, 48, 3), dtype=np.uint8)
    seen = []
    model.infer(frames, progress=lambda done, total: seen.append(ledger.readings()[0][1].used_mib))
    assert seen == [55]  # activations held during the call...
    assert ledger.readings()[0][1].used_mib == 40  # ...and freed after it
    assert model.peak_memory_bytes == 55 << 20

    ledger.set_oom_at(1, 50)
    with pytest.raises(fake.OutOfMemoryError):
        model.infer(frames)
    assert ledger.readings()[0][1].used_mib == 40
    with pytest.raises(fake.OutOfMemoryError):
        SyntheticDepth(hold_mib=20).load("cpu")


def test_without_the_index_the_synthetic_models_leave_the_ledger_alone(ledger, monkeypatch):
    from tasks.backends.synthetic import SyntheticTracker

    monkeypatch.setenv(fake.LEDGER_ENV, str(ledger.path))
    monkeypatch.delenv(fake.INDEX_ENV, raising=False)
    SyntheticTracker(hold_mib=100).load("cpu")
    assert ledger.readings()[1] == []
    monkeypatch.setenv(fake.INDEX_ENV, "gpu0")
    with pytest.raises(ValueError, match="FRAMEFLEET_FAKE_GPU_INDEX must be a GPU index"):
        SyntheticTracker().load("cpu")


def test_open_probe_takes_the_fake_from_the_argument_or_the_environment(ledger, monkeypatch):
    monkeypatch.delenv(fake.LEDGER_ENV, raising=False)
    probe = open_probe(ledger.path)
    assert probe.mode == "fake" and [g.index for g in probe.gpus()] == [0, 1] and probe.processes() == []
    monkeypatch.setenv(fake.LEDGER_ENV, str(ledger.path))
    assert open_probe().mode == "fake"


def test_open_probe_without_a_fake_reads_nvml_or_reports_no_gpu(monkeypatch):
    monkeypatch.delenv(fake.LEDGER_ENV, raising=False)
    probe = open_probe()
    try:
        if not nvml_works():
            assert probe.mode == "none" and isinstance(probe, NoGpuProbe)
            assert probe.gpus() == [] and probe.processes() == []
            with pytest.raises(NvmlUnavailable, match="NVML could not be initialised"):
                NvmlProbe()
            assert uuid_of_visible_device() is None
        else:
            assert probe.mode in ("nvml", "none")
            assert (probe.mode == "nvml") == bool(probe.gpus())
    finally:
        probe.close()


def stub_nvml(monkeypatch, count: int = 2, v3: bool = True) -> None:
    """Replace the NVML calls with a two-GPU stand-in answering as nvidia-ml-py does (bytes included)."""
    memory = types.SimpleNamespace(total=80 << 30, used=3 << 30, free=77 << 30)
    procs = {
        0: [
            types.SimpleNamespace(pid=11, usedGpuMemory=2 << 30),
            types.SimpleNamespace(pid=12, usedGpuMemory=None),
        ],  # None: the driver cannot tell
        1: [],
    }

    def running(handle):
        if not v3:
            raise pynvml.NVMLLibraryMismatchError("no _v3")
        return procs[handle]

    def utilization(handle):
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=42, memory=7)

    calls = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetMemoryInfo": lambda h: memory,
        "nvmlDeviceGetUtilizationRates": utilization,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": lambda h: [b"GPU-aaaa1111-0000", "GPU-bbbb2222-0000"][h],
        "nvmlDeviceGetComputeRunningProcesses": running,
        "nvmlDeviceGetComputeRunningProcesses_v2": lambda h: procs[h],
    }
    for name, fn in calls.items():
        monkeypatch.setattr(pynvml, name, fn)


@pytest.mark.parametrize("v3", [True, False])
def test_nvml_probe_converts_what_nvml_answers(monkeypatch, v3):
    stub_nvml(monkeypatch, v3=v3)
    probe = NvmlProbe()
    assert probe.gpus() == [
        GpuReading(0, "GPU-aaaa1111-0000", "NVIDIA H100 80GB HBM3", 81920, 3072, 78848, 42),
        GpuReading(1, "GPU-bbbb2222-0000", "NVIDIA H100 80GB HBM3", 81920, 3072, 78848, 0),
    ]
    assert probe.processes() == [ProcessReading(11, 0, 2048), ProcessReading(12, 0, 0)]
    probe.close()


@pytest.mark.parametrize(
    ("visible", "uuid"),
    [
        (None, "GPU-aaaa1111-0000"),
        ("1", "GPU-bbbb2222-0000"),
        ("1,0", "GPU-bbbb2222-0000"),
        ("GPU-bbbb2222-0000", "GPU-bbbb2222-0000"),
        ("GPU-aaaa", "GPU-aaaa1111-0000"),
        ("GPU-", None),
        ("2", None),
        ("", None),
        ("-1", None),
        ("MIG-GPU-aaaa1111-0000/1/0", None),
    ],
)
def test_the_visible_device_resolves_to_its_nvml_uuid(monkeypatch, visible, uuid):
    stub_nvml(monkeypatch)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert uuid_of_visible_device() == uuid


def test_open_probe_with_nvml_but_no_device_reports_no_gpu(monkeypatch):
    monkeypatch.delenv(fake.LEDGER_ENV, raising=False)
    stub_nvml(monkeypatch, count=0)
    probe = open_probe()
    assert probe.mode == "none" and "no GPU" in probe.reason


ALLOCATE_1GIB = """
import sys, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print(torch.cuda.get_device_properties(0).uuid, flush=True)
sys.stdin.read()
"""


@pytest.mark.gpu
def test_nvml_probe_on_a_real_gpu(monkeypatch):
    probe = NvmlProbe()
    child = subprocess.Popen(
        [sys.executable, "-c", ALLOCATE_1GIB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        gpus = probe.gpus()
        assert gpus and all(g.total_mib > 0 and g.uuid.startswith("GPU-") for g in gpus)
        torch_uuid = child.stdout.readline().strip()
        mine = uuid_of_visible_device()  # the child inherited this CUDA_VISIBLE_DEVICES
        assert mine == "GPU-" + torch_uuid.removeprefix("GPU-"), (mine, torch_uuid)
        gpu = next(g.index for g in gpus if g.uuid == mine)
        wait_until(
            lambda: any(p.pid == child.pid and p.gpu == gpu and p.used_mib >= 1000 for p in probe.processes()),
            30,
            "the 1 GiB process in NVML's list",
        )
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        assert uuid_of_visible_device() == gpus[0].uuid
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus[0].uuid)
        assert uuid_of_visible_device() == gpus[0].uuid
    finally:
        child.stdin.close()
        child.wait(timeout=30)
        probe.close()

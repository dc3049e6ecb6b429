"""On a GPU machine: a worker of queue gpuN runs on the physical GPU NVML calls N, checked by UUID."""

from __future__ import annotations

import re

import pytest


def _nvml_uuids() -> list[str]:
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        return [
            str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.gpu
def test_each_gpu_worker_is_pinned_by_uuid_to_the_gpu_its_queue_names(workers):
    uuids = _nvml_uuids()
    assert uuids, "NVML sees no GPU on the GPU machine"
    for index in sorted({0, len(uuids) - 1}):  # the first and the last GPU
        name = f"gpu{index}"
        workers.start(name, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        state = workers.state(name)
        assert state["device"] == "cuda:0" and state["gpu"] == index, state
        pinned = re.search(rf"gpu{index} pinned to (GPU-[0-9a-f-]+)", workers.log(name))
        assert pinned, workers.log(name)[-3000:]
        assert pinned.group(1) == uuids[index], (pinned.group(1), uuids)

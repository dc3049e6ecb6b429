"""Provoke GPU out-of-memory in the forms torch raises it, each in a fresh process, and check that
framefleet's recognition (tasks/errors.py ``is_gpu_oom``) names each one an OOM.

    python bench/gpu_oom_forms.py [--errors tasks/errors.py] [--out results.json]

Forms: the caching allocator's OutOfMemoryError; the first cuBLAS, cuDNN and cuFFT calls with their
inputs made first and the device then filled, through the caching allocator and then, to the last
pages, with the driver's own cuMemAlloc (as a library's handle or plan allocation finds it).
Needs a CUDA GPU; reads nothing from the network.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

# name: (inputs made before the device is filled, the call made after)
FORMS = {
    "allocator": ("", "torch.empty(1 << 42, dtype=torch.uint8, device='cuda')"),
    "cublas": (
        "a = torch.ones(64, 64, device='cuda'); c = torch.empty(64, 64, device='cuda')",
        "torch.matmul(a, a, out=c)",
    ),
    "cudnn": (
        "x = torch.ones(8, 3, 64, 64, device='cuda'); w = torch.ones(16, 3, 3, 3, device='cuda')",
        "torch.backends.cudnn.enabled = True; torch.nn.functional.conv2d(x, w)",
    ),
    "cufft": ("x = torch.ones(1 << 16, device='cuda')", "torch.fft.fft(x)"),
}

CHILD = r"""
import json, sys, traceback, torch
torch.zeros(1, device='cuda')  # the context first
exec(sys.argv[1])  # the call's inputs, before the device is full
held = []
for size in (1 << 30, 1 << 26, 1 << 20, 1 << 16):  # fill the device through the caching allocator
    while True:
        try:
            held.append(torch.empty(size, dtype=torch.uint8, device='cuda'))
        except torch.OutOfMemoryError:
            break
import ctypes  # then the last MiBs outside the caching allocator, as a library's own cudaMalloc would find them
driver = ctypes.CDLL("libcuda.so.1")
pointer = ctypes.c_uint64()
size = 1 << 24
while size >= 4096:
    if driver.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)) != 0:
        size //= 2
free, total = torch.cuda.mem_get_info()
try:
    exec(sys.argv[2])
    torch.cuda.synchronize()
    print(json.dumps({"raised": None, "free_mib": free >> 20}))
except BaseException as exc:
    print(json.dumps({"raised": type(exc).__module__ + "." + type(exc).__qualname__, "message": str(exc)[:400],
                      "free_mib": free >> 20, "pickle": None}))
    import pickle, base64
    try:
        blob = base64.b64encode(pickle.dumps(exc)).decode()
    except Exception:
        blob = None
    print(json.dumps({"blob": blob}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--errors", default=str(Path(__file__).resolve().parents[1] / "tasks" / "errors.py"))
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("ff_errors", args.errors)
    errors = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(errors)  # type: ignore[union-attr]
    import base64
    import pickle

    import torch

    results = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(0),
        "forms": {},
    }
    for name, (setup, code) in FORMS.items():
        done = subprocess.run([sys.executable, "-c", CHILD, setup, code], capture_output=True, text=True, timeout=300)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        row = lines[0] if lines else {"raised": "crash", "stderr": done.stderr[-400:]}
        blob = lines[1].get("blob") if len(lines) > 1 else None
        if row.get("raised") and blob:
            exc = pickle.loads(base64.b64decode(blob))
            row["recognised"] = bool(errors.is_gpu_oom(exc))
            row["as_framefleet"] = type(errors.as_framefleet_error(exc)).__name__
        elif row.get("raised"):  # not picklable: recognise a RuntimeError with its message
            exc = RuntimeError(row.get("message", ""))
            row["recognised_by_message"] = bool(errors.is_gpu_oom(exc))
        results["forms"][name] = row
        print(name, json.dumps(row)[:300], flush=True)
    text = json.dumps(results, indent=1)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

"""Run ViPE's ``lyra`` pipeline through framefleet's depth stage on a real clip, with random weights, and profile it.

    python bench/gpu_vipe.py --vipe SRC/hgupt3+vipe --moge SRC/microsoft+MoGe --clip CLIP.mp4 --out OUT

Two fresh processes. The first writes ViPE's model cache with random weights (bench/vipe_cache.py:
every file the pipeline opens, in upstream's format and place). The second builds the depth stage
as a worker does (``DepthStage`` with the ``vipe`` backend and configs/real-gpu.yaml's depth
parameters, ``weights_dir`` pointed at that cache), loads it on ``cuda:0`` with the network off, and
runs it on CLIP's frames at 512x384: ``--warmup`` frames once, then ``--frames`` frames timed.
It records load time, seconds per frame, GPU memory (NVML for this process, sampled every 20 ms;
torch's peaks), host RSS, and checks what the stage returns against CONTRACTS.md (depth (T, H, W)
float16 metres, intrinsics (T, 3, 3) float32 pixels, extrinsics (T, 4, 4) float32 world->camera),
with the figures that show which steps random weights make degenerate. Writes OUT/vipe.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def depth_params() -> dict[str, Any]:
    """configs/real-gpu.yaml's depth backend and parameters (y2r's), as a worker reads them."""
    import yaml

    depth = yaml.safe_load((ROOT / "configs" / "real-gpu.yaml").read_text())["stages"]["depth"]
    return {"backend": depth["backend"], **depth["params"]}


def contract(out: dict[str, Any], T: int, H: int, W: int, fov_bounds: tuple[float, float]) -> dict[str, Any]:
    """The depth stage's output against CONTRACTS.md, and the figures that show degenerate steps."""
    depths, K, E = out["depths"], out["intrinsics"], out["extrinsics"]
    d = depths.astype(np.float32)
    finite = np.isfinite(d)
    positive = finite & (d > 0)
    cam_to_world = np.linalg.inv(E.astype(np.float64))
    R = cam_to_world[:, :3, :3]
    t = cam_to_world[:, :3, 3]
    fy = float(K[0, 1, 1])
    fov_v = float(np.degrees(2 * np.arctan(H / (2 * fy))))
    rel = np.linalg.inv(cam_to_world[:1]) @ cam_to_world  # each camera in the first camera's frame
    angles = np.degrees(np.arccos(np.clip((np.trace(rel[:, :3, :3], axis1=1, axis2=2) - 1) / 2, -1, 1)))
    checks = {
        "depths (T, H, W) float16": depths.shape == (T, H, W) and depths.dtype == np.float16,
        "intrinsics (T, 3, 3) float32": K.shape == (T, 3, 3) and K.dtype == np.float32,
        "extrinsics (T, 4, 4) float32": E.shape == (T, 4, 4) and E.dtype == np.float32,
        "intrinsics the same for every frame": bool(np.all(K[:1] == K)),
        "K is [[fx,0,cx],[0,fy,cy],[0,0,1]] with fx, fy > 0": bool(
            K[0, 0, 0] > 0 and fy > 0 and K[0, 0, 1] == 0 and K[0, 1, 0] == 0 and np.all(K[0, 2] == [0, 0, 1])
        ),
        "principal point inside the frame": bool(0 < K[0, 0, 2] < W and 0 < K[0, 1, 2] < H),
        "vertical field of view within the bounds": bool(fov_bounds[0] - 0.5 <= fov_v <= fov_bounds[1] + 0.5),
        "extrinsics finite, last row 0 0 0 1": bool(np.isfinite(E).all() and np.allclose(E[:, 3], [0, 0, 0, 1])),
        "rotations orthonormal (det 1)": bool(
            np.allclose(R @ R.transpose(0, 2, 1), np.eye(3), atol=1e-3) and np.allclose(np.linalg.det(R), 1, atol=1e-3)
        ),
        "depth finite and > 0 somewhere in every frame": bool(positive.reshape(T, -1).any(axis=1).all()),
    }
    valid = d[positive]
    return {
        "checks": checks,
        "all_pass": all(checks.values()),
        "figures": {
            "depth_positive_pct": round(100 * float(positive.mean()), 3),
            "depth_nonfinite_pct": round(100 * float((~finite).mean()), 3),
            "depth_m_min_median_max": [float(valid.min()), float(np.median(valid)), float(valid.max())]
            if valid.size
            else None,
            "depth_std_per_frame_m_min_median": [
                float(np.nanmin(np.nanstd(d.reshape(T, -1), axis=1))),
                float(np.nanmedian(np.nanstd(d.reshape(T, -1), axis=1))),
            ],
            "fx_fy_cx_cy": [float(K[0, 0, 0]), fy, float(K[0, 0, 2]), float(K[0, 1, 2])],
            "vertical_fov_deg": round(fov_v, 3),
            "camera_path_m": float(np.linalg.norm(np.diff(t, axis=0), axis=1).sum()),
            "camera_max_translation_m": float(np.linalg.norm(t - t[:1], axis=1).max()),
            "camera_max_rotation_deg": float(np.nanmax(angles)),
            "poses_all_identity": bool(np.allclose(rel, np.eye(4), atol=1e-6)),
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the depth stage and run it; the peaks are this process's own."""
    from gpu_models import NvmlPeak, clip_frames

    from tasks.stages.depth import DepthStage

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    peak = NvmlPeak(0)
    params = depth_params()
    backend = params.pop("backend")
    params["weights_dir"] = str(args.cache)
    result: dict[str, Any] = {"gpu": peak.gpu_name, "backend": backend, "params": params}
    frames = clip_frames(args.clip, max(args.frames, args.warmup))
    result["clip"] = args.clip.name
    t0 = time.monotonic()
    stage = DepthStage(backend=backend, **params)
    try:
        stage.load("cuda:0")
    except Exception:
        peak.stop()
        result["error"] = "load: " + traceback.format_exc()[-6000:]
        result["load_s"] = round(time.monotonic() - t0, 2)
        return result
    import torch

    torch.cuda.synchronize()
    result["load_s"] = round(time.monotonic() - t0, 2)
    result["after_load_mib"] = {
        "nvml_process": round(peak.process_mib),
        "torch_allocated": round(torch.cuda.memory_allocated() / 2**20),
    }
    (args.out / "vipe_partial.json").write_text(json.dumps(result, indent=1))
    runs: list[dict[str, Any]] = []
    result["runs"] = runs
    out: dict[str, Any] | None = None
    try:
        for count in ([args.warmup] if args.warmup else []) + [args.frames]:
            torch.cuda.synchronize()
            t1 = time.monotonic()
            out = stage.run({"frames": frames[:count]})
            torch.cuda.synchronize()
            seconds = time.monotonic() - t1
            runs.append({"frames": count, "seconds": round(seconds, 2), "s_per_frame": round(seconds / count, 4)})
            print(f"ran {count} frames in {seconds:.1f} s", file=sys.stderr, flush=True)
            (args.out / "vipe_partial.json").write_text(json.dumps(result, indent=1))
    except Exception:  # the figures so far still count: which step failed is the finding
        result["error"] = traceback.format_exc()[-6000:]
    peak.stop()
    result["memory_mib"] = {
        "nvml_process_peak": round(peak.process_mib),
        "nvml_seen": peak.seen,
        "device_used_peak": round(peak.device_mib),
        "torch_peak_allocated": round(torch.cuda.max_memory_allocated() / 2**20),
        "torch_peak_reserved": round(torch.cuda.max_memory_reserved() / 2**20),
        "backend_peak_allocated_last_run": round(stage.peak_memory_bytes / 2**20),
        "host_rss_peak": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    if out is None or "error" in result:
        return result
    T, H, W = args.frames, frames.shape[1], frames.shape[2]
    result["quality"] = out["quality"]
    try:
        result["contract"] = contract(
            out, T, H, W, (float(params.get("fov_min_degrees", 0)), float(params.get("fov_max_degrees", 180)))
        )
    except Exception:
        result["contract_error"] = traceback.format_exc()[-3000:]
    np.savez_compressed(
        args.out / "vipe_output.npz",
        depths=out["depths"][:: max(1, T // 8)],
        intrinsics=out["intrinsics"],
        extrinsics=out["extrinsics"],
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vipe", type=Path, required=True, help="hgupt3/vipe's checkout, vipe_ext built in place")
    parser.add_argument("--moge", type=Path, required=True, help="microsoft/MoGe's checkout")
    parser.add_argument("--clip", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ff-vipe/cache"), help="ViPE's model cache")
    parser.add_argument("--frames", type=int, default=120, help="frames of the timed run")
    parser.add_argument("--warmup", type=int, default=20, help="frames of an untimed first run (0: none)")
    parser.add_argument("--cache-written", type=Path, help="the JSON line vipe_cache.py printed (skips writing)")
    parser.add_argument("--stage", choices=["all", "run"], default="all")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.stage == "run":
        print(json.dumps(run(args)))
        return
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(args.vipe), str(args.moge), os.environ.get("PYTHONPATH", "")]),
    }
    if args.cache_written:  # written beforehand (gpu_vipe.sh writes it while vipe_ext compiles)
        cache = json.loads(args.cache_written.read_text().strip().splitlines()[-1])
    else:
        t0 = time.monotonic()
        with open(args.out / "vipe_cache.log", "w") as log:
            made = subprocess.run(
                [sys.executable, str(ROOT / "bench" / "vipe_cache.py"), "--vipe", str(args.vipe), "--moge",
                 str(args.moge), "--cache", str(args.cache)],
                env=env, stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
        if made.returncode != 0:
            raise SystemExit(f"writing the random-weights cache failed: {args.out / 'vipe_cache.log'}")
        cache = json.loads(made.stdout.strip().splitlines()[-1])
        cache["seconds"] = round(time.monotonic() - t0, 1)
    with open(args.out / "vipe_run.log", "w") as log:  # streamed: a run cut short still shows how far it got
        ran = subprocess.run(
            [sys.executable, __file__, "--stage", "run", "--vipe", str(args.vipe), "--moge", str(args.moge),
             "--clip", str(args.clip), "--out", str(args.out), "--cache", str(args.cache),
             "--frames", str(args.frames), "--warmup", str(args.warmup)],
            env=env, stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
    result = {"cache": cache}
    lines = ran.stdout.strip().splitlines()
    if ran.returncode != 0 or not lines:
        result["error"] = (args.out / "vipe_run.log").read_text()[-6000:]
    else:
        result.update(json.loads(lines[-1]))
    (args.out / "vipe.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "cache"}, indent=1))
    sys.exit(0 if "error" not in result else 1)


if __name__ == "__main__":
    main()

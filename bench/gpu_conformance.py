"""TAPIP3D and WiLoR through their real upstream code and framefleet's backends on a GPU, with random weights.

    python bench/gpu_conformance.py --upstream DIR --out OUT [--models tapip3d,wilor] [--chain]

DIR holds the upstream checkouts at deploy/envs/pins.sh's commits, as bench/gpu_lib.sh's ``upstream`` lays
them out (``zbw001+TAPIP3D`` with pointops2 installed, ``rolpotamias+WiLoR``). Per model, each step in a fresh process:

- ``prepare``: random weights written where and how upstream loads them (TAPIP3D: the
  ``{"cfg", "weight"}`` checkpoint of ``models.from_pretrained``, its cfg reconstructed in
  ``tapip3d_config``; WiLoR: Lightning's checkpoint, random MANO files, and an ultralytics YOLOv8
  detector built from its yaml and saved as ultralytics saves one);
- ``run``: the stage class a worker runs (``TracksStage``/``HandsStage`` with backend ``tapip3d``
  or ``wilor``) at y2r's settings (configs/real-gpu.yaml) on a real clip, its depth from the
  ``classical`` depth stage; the output checked against the contract (shapes, dtypes, units, NaN
  rules), and its peaks measured: NVML for this process (sampled every 20 ms), torch's, time per
  window (tracks) or frame (hands);
- ``--chain``: a dataset of a real clip through real workers (``framefleet run``) with both
  backends, then ``framefleet verify`` and a look at the HDF5 file.

Writes OUT/<model>-<step>.json, OUT/chain.json and OUT/table.md. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gpu_models import NvmlPeak  # noqa: E402  (bench/gpu_models.py)


def real_data() -> Path:
    """The real clips: $FRAMEFLEET_REAL_DATA, else shared/data/real beside the repository (or a folder above it)."""
    if os.environ.get("FRAMEFLEET_REAL_DATA"):
        return Path(os.environ["FRAMEFLEET_REAL_DATA"])
    for parent in ROOT.parents[:4]:
        if (parent / "shared" / "data" / "real" / "dog.mp4").is_file():
            return parent / "shared" / "data" / "real"
    raise SystemExit(
        "the real clips (shared/data/real) are not beside the repository: set FRAMEFLEET_REAL_DATA, or give "
        "--tracks-clip and --hands-clip (bench/gpu_conformance.sh does, from bench/gpu_lib.sh's clip)"
    )


L = 10  # configs/real-gpu.yaml: tracks window_length 10, stride 1
GRID = 64  # configs/real-gpu.yaml: tracks grid_size 64 when there is no mask
TRACKS = dict(
    window_length=L, stride=1, target_points=64, mask_erosion_pixels=2, grid_size=GRID,
    window_pose_order="y2r", visibility_threshold=0.0, resolution_factor=1,
)  # fmt: skip
HANDS = dict(
    batch_size=256, detection_confidence=0.75, wrist_depth_offset=0.02, hand_frame="y2r",
    max_hand_velocity=1.0, max_interpolation_gap=20,
)  # fmt: skip


def tapip3d_config() -> Any:
    """TAPIP3D's checkpoint ``cfg``, reconstructed from its code (the released checkpoint's is not published).

    What the code fixes: ``models/__init__.py`` reads ``cfg.model`` (``name`` point_tracker_3d[_local]) and
    ``cfg.train_dataset.resolution``; the encoder is ``cotracker_cnn`` whose weights must load into
    CoTracker3's ``fnet`` (``models/encoders/cotracker_cnn.py:23-27``: ``BasicEncoder(output_dim=128,
    stride=4)``); the corr processor ``knn_corr_4d_optimized`` asserts ``better_depth_downsample``
    (knn_feature_4d_optimized.py:182); the updater's ``input_dim`` must equal 1 (visibility) + levels x
    transformer_dim + 6 x 33 (the posenc of the forward/backward motion, point_tracker_3d.py:187-221);
    its output's first 4 channels are dx, dy, dz, visibility (point_tracker_3d.py:233-234). A reading
    of the released checkpoint (published alongside TAPIP3D-based code) gives: seq_len 16, 4 levels,
    isotropic normalisation, 32 neighbours, an EfficientUpdateFormer of 3 time and 3 space blocks with
    64 virtual tracks. Assumed (CoTracker3's values where it has one): updater hidden 384, 8 heads,
    MLP ratio 4, a separate visibility/confidence head (output 5); neighbour transformer 128-d, 8 heads of
    16, MLP ratio 4; posenc MLP 2 layers of 256; no local-position or uv inputs; training resolution
    384x512 (it has no effect: ``inference`` sets the size to the video's).
    ``encoder.pretrained`` is false: true makes the load call ``torch.hub.load`` (cotracker_cnn.py:24-25).
    """
    from omegaconf import OmegaConf

    levels, dim = 4, 128
    return OmegaConf.create(
        {
            "model": {
                "name": "point_tracker_3d_local",
                "seq_len": 16,
                "corr_levels": levels,
                "norm_mode": "isotropic",
                "norm_scale": 1.0,
                "use_local_pos_input": False,
                "use_uv_input": False,
                "eval_mode": "raw",
                "encoder": {"name": "cotracker_cnn", "output_dim": 128, "stride": 4, "pretrained": False,
                            "freeze_mode": "none"},
                "corr_feature": {"name": "knn_corr_4d_optimized", "k_neighbors": 32, "posenc_mlp_dim": 256,
                                 "posenc_mlp_layers": 2, "transformer_dim": dim, "transformer_num_heads": 8,
                                 "transformer_head_dim": 16, "transformer_mlp_ratio": 4.0,
                                 "better_depth_downsample": True},
                "point_updater": {"name": "efficient_updateformer", "space_depth": 3, "time_depth": 3,
                                  "input_dim": 1 + levels * dim + 6 * 33, "hidden_size": 384, "num_heads": 8,
                                  "output_dim": 5, "mlp_ratio": 4.0, "num_virtual_tracks": 64,
                                  "add_space_attn": True, "linear_layer_for_vis_conf": True},
            },
            "train_dataset": {"resolution": [384, 512]},
        }
    )  # fmt: skip


def prepare_tapip3d(repo: Path, weights: Path) -> dict[str, Any]:
    """Build TAPIP3D from ``tapip3d_config`` by its own ``models.from_config``; save what ``from_pretrained`` reads."""
    import torch

    torch.manual_seed(0)
    sys.path.insert(0, str(repo))
    os.chdir(repo)
    import models  # TAPIP3D's (imports pointops2's CUDA extension)

    cfg = tapip3d_config()
    net = models.from_config(cfg["model"], image_size=cfg["train_dataset"]["resolution"])
    weights.mkdir(parents=True, exist_ok=True)
    path = weights / "tapip3d_final.pth"  # the README's name, the backend's default ``checkpoint``
    torch.save({"cfg": cfg, "weight": net.state_dict()}, path)
    return {
        "checkpoint": str(path),
        "parameters": sum(p.numel() for p in net.parameters()),
        "bytes": path.stat().st_size,
    }


def prepare_wilor(repo: Path, weights: Path, detector_scale: str) -> dict[str, Any]:
    """WiLoR's network and random MANO files (bench/gpu_models.py), and a random hand detector."""
    import torch
    from gpu_models import wilor_files

    torch.manual_seed(0)
    wilor_files(repo, weights)
    return prepare_detector(weights, detector_scale)


def prepare_detector(weights: Path, scale: str) -> dict[str, Any]:
    """A random YOLOv8 (``scale``) of WiLoR's two classes in ``weights``/detector.pt, saved as ultralytics saves one."""
    import torch
    import ultralytics
    from ultralytics.nn.tasks import DetectionModel

    # WiLoR's detector has two classes, 0 left and 1 right (y2r and WiLoR's demo read cls as is_right).
    det = DetectionModel(f"yolov8{scale}.yaml", nc=2, verbose=False)
    det.names = {0: "left", 1: "right"}
    # Random weights score every box near 0 (Detect.bias_init); a class bias of +3 (0.95) lets random
    # boxes pass y2r's detection_confidence 0.75, so that WiLoR runs on them.
    for branch in det.model[-1].cv3:
        torch.nn.init.constant_(branch[-1].bias, 3.0)
    weights.mkdir(parents=True, exist_ok=True)
    path = weights / "detector.pt"  # ultralytics' checkpoint: the model pickled in half precision
    torch.save(
        {"model": det.half(), "train_args": {"task": "detect", "imgsz": 640}, "version": ultralytics.__version__},
        path,
    )
    return {"detector": f"yolov8{scale}", "detector_parameters": sum(p.numel() for p in det.parameters())}


def stage_inputs(clip: Path, frames: int, target_fps: float) -> dict[str, Any]:
    """The preprocess stage's frames of ``clip`` (first ``frames``) and the classical depth stage's output on them."""
    from tasks.stages.depth import DepthStage
    from tasks.stages.preprocess import PreprocessStage

    pre = PreprocessStage(target_fps=target_fps).run({"video_path": str(clip)})
    rgb = pre["frames"][:frames]
    depth = DepthStage(backend="classical")
    depth.load("cpu")
    return {"frames": rgb, "fps": float(pre["fps"]), **depth.run({"frames": rgb})}


def run_tapip3d(repo: Path, weights: Path, clip: Path, frames: int, device: str) -> dict[str, Any]:
    """The tracks stage with TAPIP3D on ``frames`` frames of ``clip`` at 10 fps: contract, peaks, time per window."""
    import torch

    from tasks.stages.tracks import TracksStage, grid_queries

    inputs = stage_inputs(clip, frames, 10.0)
    T = len(inputs["frames"])
    peak = NvmlPeak(torch.device(device).index or 0)
    t0 = time.perf_counter()
    stage = TracksStage(backend="tapip3d", repo_dir=str(repo), weights_dir=str(weights), **TRACKS)
    stage.load(device)
    torch.cuda.synchronize()
    res: dict[str, Any] = {"load_s": round(time.perf_counter() - t0, 2), "frames": T, "clip": clip.name}
    model, times, peaks = stage.model, [], []
    track = model.track

    def timed(**kw: Any) -> np.ndarray:
        t = time.perf_counter()
        out = track(**kw)
        times.append(time.perf_counter() - t)
        peaks.append(model.peak_memory_bytes)
        return out

    model.track = timed
    out = stage.run({k: inputs[k] for k in ("frames", "depths", "intrinsics", "extrinsics")})
    peak.stop()
    starts, tracks, n = out["window_starts"], out["tracks"], out["num_points"]
    W = T - L + 1
    E = inputs["extrinsics"].astype(np.float64)
    expect_n = [len(grid_queries(inputs["depths"][s], inputs["intrinsics"][s], GRID)[1]) for s in range(W)]
    q0 = grid_queries(inputs["depths"][0], inputs["intrinsics"][0], GRID)[1]
    step0 = np.linalg.norm(tracks[0, 0, : n[0]] - q0, axis=-1)
    checks = {
        "windows": list(starts) == list(range(W)) and tracks.shape[:2] == (W, L),
        "dtype_float32": tracks.dtype == np.float32 and out["window_poses"].dtype == np.float32,
        "grid_queries": bool(list(n) == expect_n and max(n) <= GRID * GRID and tracks.shape[2] == max(n)),
        "finite_where_tracked": all(np.isfinite(tracks[w, :, : n[w]]).all() for w in range(W)),
        "zero_padding": all((tracks[w, :, n[w] :] == 0).all() for w in range(W)),
        "window_poses_y2r": bool(
            np.allclose(out["window_poses"], [np.linalg.inv(E[s]) @ E[s : s + L] for s in range(W)], atol=1e-4)
        ),
        "intrinsics": bool(np.allclose(out["intrinsics"], inputs["intrinsics"][0])),
        # Metres in the first camera's frame: step 0 starts at the query points (random weights move them a little).
        "step0_near_queries": float(np.median(step0)) < 0.5 * float(np.median(q0[:, 2])),
    }  # fmt: skip
    # The NaN rule: a point not visible at every step is NaN at every step (y2r drops it), shape kept.
    model.visibility_threshold = 0.5
    w0 = slice(0, L)
    pixels, queries = grid_queries(inputs["depths"][0], inputs["intrinsics"][0], GRID)
    window = {k: inputs[k][w0] for k in ("frames", "depths", "intrinsics", "extrinsics")}
    one = track(queries=queries, query_pixels=pixels, **window)
    nan_points = np.isnan(one).any(axis=(0, 2))
    checks["nan_rule"] = one.shape == (L, len(queries), 3) and bool(
        (np.isnan(one).all(axis=(0, 2)) == nan_points).all()
    )
    res.update(
        checks=checks,
        ok=all(checks.values()),
        windows=W,
        points_per_window=int(np.median(n)),
        step0_median_offset_m=round(float(np.median(step0)), 4),
        dropped_at_visibility_0_5=round(float(nan_points.mean()), 3),
        unit=f"window of {L} frames, {int(np.median(n))} queries (grid {GRID})",
        first_unit_s=round(times[0], 3),
        unit_s=round(float(np.median(times[1:])), 3),
        torch_peak_allocated_mib=round(max(peaks) / 2**20, 1),
        **peaks_of(peak),
    )
    return res


def run_wilor(
    repo: Path, weights: Path, clip: Path, frames: int, device: str, pyrender_standin: bool
) -> dict[str, Any]:
    """The hands stage with WiLoR and its detector on ``frames`` frames of ``clip``: contract, peaks, time per frame.

    ``pyrender_standin``: WiLoR's renderers' pyrender replaced by an empty module (nothing renders in
    inference), for a machine without EGL; the adapter imports the real one otherwise.
    """
    import torch

    if pyrender_standin:
        import unittest.mock

        sys.modules["pyrender"] = unittest.mock.MagicMock()

    from tasks.stages.hands import HandsStage

    inputs = stage_inputs(clip, frames, 10.0)
    T = len(inputs["frames"])
    peak = NvmlPeak(torch.device(device).index or 0)
    t0 = time.perf_counter()
    stage = HandsStage(backend="wilor", repo_dir=str(repo), weights_dir=str(weights), **HANDS)
    stage.load(device)
    torch.cuda.synchronize()
    res: dict[str, Any] = {"load_s": round(time.perf_counter() - t0, 2), "frames": T, "clip": clip.name}
    model = stage.model
    res["pyrender"] = str(getattr(sys.modules.get("pyrender"), "__file__", "stand-in"))
    detector, detect, seen = model._api["detector"], model.detect, {}

    def timed_detector(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = detector(*a, **kw)
        seen["detector_s"] += time.perf_counter() - t
        seen["detector_calls"].append(len(a[0]))
        return out

    def timed_detect(*a: Any, **kw: Any) -> Any:
        seen["detector_s"], seen["detector_calls"] = 0.0, []  # the detector runs in chunks of detection_batch
        t = time.perf_counter()
        out = detect(*a, **kw)
        seen.setdefault("detect_s", []).append(time.perf_counter() - t)
        seen["raw_valid"] = {side: int(out[side]["valid"].sum()) for side in ("left", "right")}
        return out

    model._api["detector"], model.detect = timed_detector, timed_detect
    stage_in = {"frames": inputs["frames"], "intrinsics": inputs["intrinsics"][0], "depths": inputs["depths"],
                "fps": inputs["fps"]}  # fmt: skip
    out = stage.run(stage_in)
    out = stage.run(stage_in)  # the second call is the steady one
    peak.stop()
    checks: dict[str, bool] = {}
    depth_max = float(np.nanmax(inputs["depths"]))
    for side in ("left", "right"):
        v, pose = out[f"{side}_valid"], out[f"{side}_wrist_pose"]
        hp, joints, betas = out[f"{side}_hand_pose"], out[f"{side}_joints_3d"], out[f"{side}_betas"]
        R = pose[v, :3, :3].astype(np.float64)
        checks[f"{side}_shapes"] = (
            v.shape == (T,) and v.dtype == bool and pose.shape == (T, 4, 4) and hp.shape == (T, 15, 3, 3)
            and joints.shape == (T, 21, 3) and betas.shape == (10,)
            and all(a.dtype == np.float32 for a in (pose, hp, joints, betas))
        )  # fmt: skip
        checks[f"{side}_nan_where_invalid"] = bool(np.isnan(pose[~v]).all() and np.isnan(joints[~v]).all())
        checks[f"{side}_finite_where_valid"] = bool(np.isfinite(pose[v]).all() and np.isfinite(hp[v]).all())
        checks[f"{side}_rotations"] = bool(
            np.allclose(R @ R.transpose(0, 2, 1), np.eye(3), atol=1e-3) and np.allclose(np.linalg.det(R), 1, atol=1e-3)
        )
        # Metres in the camera's frame: the wrist sits on the depth map, plus the 2 cm offset.
        z = pose[v, 2, 3]
        checks[f"{side}_wrist_depth_m"] = bool(((z > 0) & (z <= depth_max + HANDS["wrist_depth_offset"] + 1e-3)).all())
    checks["detections"] = sum(seen["raw_valid"].values()) > 0
    res.update(
        checks=checks,
        ok=all(checks.values()),
        raw_detections=seen["raw_valid"],
        valid_frames={side: int(out[f"{side}_valid"].sum()) for side in ("left", "right")},
        unit=f"frame of a {T}-frame video (YOLO on {model.detection_batch} frames a call; WiLoR in batches of 256)",
        detector_calls=seen["detector_calls"],
        first_unit_s=round(seen["detect_s"][0] / T, 4),
        unit_s=round(seen["detect_s"][-1] / T, 4),
        detector_s_per_frame=round(seen["detector_s"] / T, 4),
        torch_peak_allocated_mib=round(model.peak_memory_bytes / 2**20, 1),
        **peaks_of(peak),
    )
    return res


def peaks_of(peak: NvmlPeak) -> dict[str, Any]:
    import resource

    import torch

    return {
        "torch_peak_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20, 1),
        "nvml_process_peak_mib": round(peak.process_mib, 1) if peak.seen else None,
        "nvml_device_peak_mib": round(peak.device_mib, 1),
        "host_rss_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "gpu": peak.gpu_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def chain(tapip3d: tuple[Path, Path], wilor: tuple[Path, Path], clip: Path, out: Path) -> dict[str, Any]:
    """``framefleet run`` of ``clip`` with both backends through real workers, ``framefleet verify``, the HDF5 file."""
    import shutil

    import h5py

    raw, data = out / "raw", out / "dataset"
    shutil.rmtree(out, ignore_errors=True)
    raw.mkdir(parents=True)
    shutil.copy(clip, raw / clip.name)
    tracks = {"repo_dir": str(tapip3d[0]), "weights_dir": str(tapip3d[1]), **TRACKS}
    hands = {"repo_dir": str(wilor[0]), "weights_dir": str(wilor[1]), **HANDS}
    settings = {
        "stages": {
            "preprocess": {"params": {"target_fps": 2.5}},  # 11 frames of dog.mp4: two windows
            "masks": {"enabled": False},
            "depth": {"backend": "classical"},
            "tracks": {"backend": "tapip3d", "params": tracks},
            "hands": {"backend": "wilor", "params": hands},
        }
    }
    config = out / "settings.json"  # YAML's superset: the loader reads it
    config.write_text(json.dumps(settings))
    env = {**os.environ, "FRAMEFLEET_CONFIG": str(config), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "scripts" / "run_local.py"), str(raw), "--out", str(data), "--gpus", "0"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    res: dict[str, Any] = {"run_exit": done.returncode, "run_s": round(time.perf_counter() - t0, 1)}
    (out / "run.log").write_text(done.stdout + done.stderr)
    print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "verify_dataset.py"), str(data)], env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    res["verify_exit"] = check.returncode
    res["verify_tail"] = (check.stdout + check.stderr)[-600:]
    files = sorted(data.glob("*.hdf5"))
    if files:
        with h5py.File(files[0], "r") as f:
            root = f["root"]
            groups = sorted(root["tracks"])
            first = root["tracks"][groups[0]] if groups else None
            res["hdf5"] = {
                "video": list(root["video"].shape),
                "depth": list(root["depth"].shape),
                "windows": len(groups),
                "points_first_window": int(first["query_coords"].shape[0]) if first is not None else None,
                "displacements": list(first["displacements"].shape) if first is not None else None,
                "hand_keys_first_window": sorted(k for k in first if "wrist" in k) if first is not None else [],
            }
    res["ok"] = done.returncode == 0 and check.returncode == 0 and bool(files)
    return res


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| model | ok | load s | s per unit, median (first) | unit | torch peak MiB (reserved) | NVML process peak MiB"
        " | host RSS MiB |",
        "|" + "---|" * 8,
    ]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][-300:]} |||||||")
            continue
        lines.append(
            f"| {name} | {r['ok']} | {r['load_s']} | {r['unit_s']} ({r['first_unit_s']}) | {r['unit']} | "
            f"{r['torch_peak_allocated_mib']} ({r['torch_peak_reserved_mib']}) | {r['nvml_process_peak_mib']} | "
            f"{r['host_rss_peak_mib']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="tapip3d,wilor")
    parser.add_argument("--step", choices=["all", "prepare", "run", "chain"], default="all")
    parser.add_argument("--weights", type=Path, default=Path("/tmp/ff-conformance-weights"))
    parser.add_argument("--clip", type=Path, help="both models' clip (default: --tracks-clip and --hands-clip)")
    parser.add_argument("--tracks-clip", type=Path, help="default: dog.mp4 of the real clips (a moving camera)")
    parser.add_argument("--hands-clip", type=Path, help="default: pstudio.mp4 of the real clips")
    parser.add_argument("--frames", type=int, default=0, help="default: 24 (tracks: 15 windows), 150 (hands)")
    parser.add_argument("--detector", default="x", help="YOLOv8 scale of the random hand detector (n s m l x)")
    parser.add_argument("--chain", action="store_true", help="also run a dataset through real workers")
    parser.add_argument("--chain-dir", type=Path, default=Path("/tmp/ff-conformance-chain"), help="its dataset")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--pyrender-standin", action="store_true", help="WiLoR: pyrender replaced (no EGL)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    up = args.upstream.resolve()
    repos = {"tapip3d": up / "zbw001+TAPIP3D", "wilor": up / "rolpotamias+WiLoR"}
    clips = {"tapip3d": args.clip or args.tracks_clip, "wilor": args.clip or args.hands_clip}
    for model, name in (("tapip3d", "dog.mp4"), ("wilor", "pstudio.mp4")):
        clips[model] = clips[model] or real_data() / name
    frames = {"tapip3d": 24, "wilor": 150}
    if args.step in ("prepare", "run"):
        (model,) = args.models.split(",")
        repo, weights = repos[model], args.weights / model
        if args.step == "prepare":
            res = prepare_tapip3d(repo, weights) if model == "tapip3d" else prepare_wilor(repo, weights, args.detector)
        elif model == "tapip3d":
            res = run_tapip3d(repo, weights, clips[model], args.frames or frames[model], args.device)
        else:
            clip, count = clips[model], args.frames or frames[model]
            res = run_wilor(repo, weights, clip, count, args.device, args.pyrender_standin)
        (args.out / f"{model}-{args.step}.json").write_text(json.dumps(res, indent=1, default=str))
        print(json.dumps(res, default=str))
        return
    if args.step == "chain":
        res = chain(
            (repos["tapip3d"], args.weights / "tapip3d"), (repos["wilor"], args.weights / "wilor"),
            clips["tapip3d"], args.chain_dir,
        )  # fmt: skip
        (args.out / "chain.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res))
        sys.exit(0 if res["ok"] else 1)
    rows: dict[str, dict[str, Any]] = {}
    base = [sys.executable, __file__, "--upstream", str(up), "--out", str(args.out), "--weights", str(args.weights)]
    base += ["--device", args.device, "--detector", args.detector]
    for model in args.models.split(","):
        extra = ["--frames", str(args.frames), "--tracks-clip", str(clips["tapip3d"])]
        extra += ["--hands-clip", str(clips["wilor"])]
        for step in ("prepare", "run"):
            t = time.perf_counter()
            done = subprocess.run([*base, "--models", model, "--step", step, *extra], capture_output=True, text=True)
            (args.out / f"{model}-{step}.log").write_text(done.stdout + done.stderr)
            print(f"{model} {step}: exit {done.returncode} in {time.perf_counter() - t:.0f} s", flush=True)
            said = done.stderr + done.stdout
            no_gl = any(word in said for word in ("OpenGL", "EGL", "pyrender", "pyglet"))
            if done.returncode != 0 and model == "wilor" and step == "run" and no_gl:
                # No EGL here: say so, and run the rest with pyrender replaced.
                rows["wilor (real pyrender)"] = {"error": done.stderr[-600:]}
                extra.append("--pyrender-standin")
                done = subprocess.run(
                    [*base, "--models", model, "--step", step, *extra], capture_output=True, text=True
                )
                (args.out / f"{model}-{step}-standin.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                rows[model] = {"error": f"{step} exit {done.returncode}: {done.stderr[-1500:]}"}
                break
        else:
            rows[model] = json.loads((args.out / f"{model}-run.json").read_text())
    ok = all(r.get("ok") for r in rows.values())
    text = table(rows)
    if args.chain:
        done = subprocess.run(
            [*base, "--step", "chain", "--tracks-clip", str(clips["tapip3d"])], capture_output=True, text=True
        )
        (args.out / "chain-step.log").write_text(done.stdout + done.stderr)
        ok = ok and done.returncode == 0
        text += "\n\nchain: " + (done.stdout.strip().splitlines() or [done.stderr[-1500:]])[-1]
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

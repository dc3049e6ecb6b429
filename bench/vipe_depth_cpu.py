"""On the CPU: ViPE's depth alignment inputs from a random-weights cache, through upstream's own inference code.

    PYTHONPATH=SITE:SRC/hgupt3+vipe:SRC/microsoft+MoGe python bench/vipe_depth_cpu.py --cache DIR \
        [--clip CLIP.mp4] [--frames 30] [--vda-input-size 140]

What ViPE's ``lyra`` pipeline feeds ``align_inv_depth_to_depth`` (vipe/pipeline/processors.py:
264-350), for the cache ``bench/vipe_cache.py`` writes: MoGe's metric depth on the clip's first frame
through ViPE's ``MogeModel.estimate`` (the target when SLAM's map covers little, processors.py:
312-316); Video-Depth-Anything (vitl) over ``--frames`` frames through its wrapper's ``estimate``
(the source; ``--vda-input-size`` below upstream's 518 only to spare CPU time: same code and
windows); the alignment on frame 0 with the mask ViPE builds (no detections: every pixel, no sky);
the rest of ``update_iterator`` over every frame (momentum, inverse, clamp); and PriorDA, the target
when SLAM's map covers enough (processors.py:318-333), prompted with MoGe's depth on every 8th pixel.
For each: how much is positive and finite, its range, and the largest activation in float32 (the GPU
runs MoGe and VDA-L in float16). Prints one JSON line.

Only what cannot run on a CPU torch is replaced: ``.cuda()`` and CUDA devices map to the CPU, and
``vipe_ext``'s CUDA KNN (csrc/utils_ext/knn.cu: squared L2, ``(dists, indices)``) is ``cdist`` + ``topk``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FACTORIES = ("rand", "randn", "zeros", "ones", "empty", "full", "arange", "tensor", "linspace")
FACTORIES += ("rand_like", "randn_like", "zeros_like", "ones_like", "empty_like", "full_like")


def cpu_only() -> None:
    """Map ViPE's CUDA placements to the CPU in this process, and stand in for the ``vipe_ext`` ops it calls."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from vipe_cache import classes_without_cuda_ops

    classes_without_cuda_ops()

    def cpu(a: Any) -> Any:
        cuda = (isinstance(a, str) and a.startswith("cuda")) or (isinstance(a, torch.device) and a.type == "cuda")
        return "cpu" if cuda else a

    def mapped(f: Any) -> Any:
        return lambda *a, **k: f(*[cpu(x) for x in a], **{n: cpu(v) for n, v in k.items()})

    torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.nn.Module.to = mapped(torch.nn.Module.to)  # type: ignore[method-assign]
    torch.Tensor.to = mapped(torch.Tensor.to)  # type: ignore[method-assign]
    for name in FACTORIES:
        setattr(torch, name, mapped(getattr(torch, name)))
    load = torch.load
    torch.load = lambda *a, **k: load(*a, **{**k, "map_location": "cpu"})  # type: ignore[assignment]
    torch.cuda.empty_cache = lambda: None

    def nearest_neighbours(query: Any, tree: Any, knn: int) -> list[Any]:
        dists, inds = (torch.cdist(query, tree) ** 2).topk(knn, dim=1, largest=False)
        return [dists, inds]

    sys.modules["vipe_ext"].utils_ext = types.SimpleNamespace(nearest_neighbours=nearest_neighbours)  # type: ignore[attr-defined]


def summary(x: Any) -> dict[str, Any]:
    """Positive and finite share (%), min/median/max and std of the finite values."""
    import torch

    x = x.float()
    finite = torch.isfinite(x)
    v = x[finite]
    return {
        "finite_pct": round(100 * finite.float().mean().item(), 2),
        "positive_pct": round(100 * (finite & (x > 0)).float().mean().item(), 2),
        "min_median_max": [round(q, 5) for q in (v.min().item(), v.median().item(), v.max().item())]
        if v.numel()
        else None,
        "std": round(v.std().item(), 5) if v.numel() > 1 else None,
    }


class LargestActivation:
    """The largest |output| of any leaf module of ``model`` while it runs (what float16 would have to hold)."""

    def __init__(self, model: Any) -> None:
        self.value, self.where = 0.0, ""
        leaves = [m for m in model.modules() if not list(m.children())]
        self.hooks = [m.register_forward_hook(self.see) for m in leaves]

    def see(self, module: Any, inputs: Any, out: Any) -> None:
        if hasattr(out, "is_floating_point") and out.is_floating_point() and out.numel():
            value = float(out.detach().abs().max())
            if value > self.value or not math.isfinite(value):
                self.value, self.where = value, type(module).__name__

    def stop(self) -> list[Any]:
        for h in self.hooks:
            h.remove()
        return [round(self.value, 3), self.where]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import os

    os.environ.update(HF_HOME=str(args.cache / "huggingface"), HF_HUB_OFFLINE="1", TORCH_HOME=str(args.cache / "torch"))
    cpu_only()
    import numpy as np
    import torch
    from gpu_models import clip_frames
    from vipe.priors.depth.alignment import align_inv_depth_to_depth
    from vipe.priors.depth.base import DepthEstimationInput
    from vipe.priors.depth.moge import MogeModel
    from vipe.priors.depth.priorda import PriorDAModel
    from vipe.priors.depth.videodepthanything import VideoDepthAnythingDepthModel
    from vipe.utils.cameras import CameraType

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    frames = clip_frames(args.clip, args.frames)
    T, H, W = frames.shape[:3]
    fy = H / 2 / math.tan(math.radians(30))  # GeoCalib's random estimate, clamped to y2r's 60 degrees
    K = torch.tensor([fy, fy, W / 2, H / 2])
    rgb0 = torch.from_numpy(frames[0]).float() / 255
    out: dict[str, Any] = {"clip": args.clip.name, "frames": T, "vda_input_size": args.vda_input_size}

    t0 = time.monotonic()
    moge = MogeModel()
    peak = LargestActivation(moge.model)
    target = moge.estimate(DepthEstimationInput(rgb=rgb0, intrinsics=K, camera_type=CameraType.PINHOLE)).metric_depth
    out["moge_frame0"] = {**summary(target), "largest_activation": peak.stop(), "s": round(time.monotonic() - t0, 1)}
    print(json.dumps(out), file=sys.stderr, flush=True)  # so far, should a later step fail
    del moge

    t0 = time.monotonic()
    vda = VideoDepthAnythingDepthModel(model="vitl")
    vda.input_size = args.vda_input_size
    peak = LargestActivation(vda.model)
    video = [f.astype(np.float32) / 255 for f in frames]
    source = vda.estimate(DepthEstimationInput(video_frame_list=video)).relative_inv_depth
    over = (source > 1e-3).float().mean(dim=(1, 2))
    out["vda"] = {
        **summary(source),
        "over_1e-3_pct_min_frame": round(100 * over.min().item(), 2),
        "largest_activation": peak.stop(),
        "s": round(time.monotonic() - t0, 1),
    }
    del vda

    # processors.py:336-339 with frame.mask all True and no sky (the detector finds nothing).
    align_mask = source[0] > 1e-3
    fit: dict[str, Any] = {
        "align_mask_pct": round(100 * align_mask.float().mean().item(), 2),
        "target_mask_pct": round(100 * (align_mask & (target > 0)).float().mean().item(), 2),
    }
    try:
        _, scale, bias = align_inv_depth_to_depth(source[0], target, align_mask)
        fit.update(scale=float(scale), bias=float(bias))
    except RuntimeError as e:
        fit["error"] = str(e)
    out["align_frame0"] = fit
    print(json.dumps(out), file=sys.stderr, flush=True)
    if "error" not in fit:
        out["metric_depth_all_frames"] = update_iterator_rest(source, target, align_inv_depth_to_depth)

    t0 = time.monotonic()
    try:
        prompt = torch.zeros(H, W)
        prompt[3::8, 3::8] = target[3::8, 3::8]
        prior = PriorDAModel().estimate(DepthEstimationInput(rgb=rgb0, prompt_metric_depth=prompt)).metric_depth
        out["priorda_frame0"] = {**summary(prior), "s": round(time.monotonic() - t0, 1)}
        _, scale, bias = align_inv_depth_to_depth(source[0], prior, align_mask)
        out["priorda_frame0"].update(scale=float(scale), bias=float(bias))
    except (RuntimeError, ValueError) as e:
        out.setdefault("priorda_frame0", {})["error"] = f"{type(e).__name__}: {e}"
    return out


def update_iterator_rest(source: Any, target: Any, align: Any) -> dict[str, Any]:
    """processors.py:335-361 over every frame, frame 0's target standing for each frame's."""
    import torch

    cached: tuple[Any, Any] | None = None
    depths = []
    for inv in source:
        try:
            _, scale, bias = align(inv, target, inv > 1e-3)
        except RuntimeError:
            if cached is None:
                raise
            scale, bias = cached
        if cached is None:
            cached = (scale, bias)
        cached = (cached[0] * 0.99 + scale * 0.01, cached[1] * 0.99 + bias * 0.01)
        aligned = inv * cached[0] + cached[1]
        aligned[aligned < 1e-3] = 1e-3
        depths.append(aligned.reciprocal())
    d = torch.stack(depths)
    return {
        **summary(d),
        "std_per_frame_min_m": round(d.std(dim=(1, 2)).min().item(), 5),
        "float16_finite": bool(torch.isfinite(d.half()).all()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, required=True, help="the cache bench/vipe_cache.py wrote")
    parser.add_argument("--clip", type=Path, default=ROOT.parent / "shared" / "data" / "real" / "sheep.mp4")
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--vda-input-size", type=int, default=140, help="upstream's is 518")
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()

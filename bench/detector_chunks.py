"""WiLoR's YOLO hand detector on a real clip in one call (y2r's way) and in chunks: the same boxes? what peak?

    python bench/detector_chunks.py [--frames 150] [--device cuda:0] [--scale x] [--chunks 0,32,8,1]

Needs ultralytics (deploy/envs/wilor.lock's 8.1.34). A random YOLOv8 (``--scale``) of WiLoR's two
classes is saved as ultralytics saves one (``gpu_conformance.prepare_detector``) and loaded with
``ultralytics.YOLO``; ``--frames`` frames of ``--clip`` at the pipeline's 512x384, 10 fps, go
through the ``wilor`` backend's ``detect_in_chunks`` at each chunk size (0: every frame in one call).
Per chunk size: whether every frame's boxes, scores and classes equal the one call's bit for bit
(else how many frames differ and by how much), the time per frame, and on a GPU torch's peak
allocated memory. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clip", default="pstudio.mp4", help="a clip of the real-data folder")
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scale", default="x", help="YOLOv8 scale of the random detector (n s m l x)")
    parser.add_argument("--chunks", default="0,32,8,1", help="frames per detector call; 0 is one call")
    parser.add_argument("--confidence", type=float, default=0.75, help="y2r's detection_confidence")
    parser.add_argument(
        "--class-bias",
        type=float,
        default=3.0,
        help="the random detector's class bias: 3 (gpu_conformance's) passes every box, ~0 a few near the threshold",
    )
    parser.add_argument(
        "--nms-s-per-image",
        type=float,
        default=None,
        help="NMS's time allowance per image (ultralytics: 0.05 s, utils/ops.py:173), for a slow NMS that would "
        "otherwise stop early and drop the later images' boxes (a CPU without torchvision's kernels)",
    )
    args = parser.parse_args()

    import torch
    import ultralytics
    from gpu_conformance import prepare_detector, real_data

    from tasks.backends.wilor import _full_torch_load, detect_in_chunks
    from tasks.stages.preprocess import PreprocessStage

    if args.nms_s_per_image is not None:
        import functools

        from ultralytics.utils import ops

        # The predictor calls it through the module (models/yolo/detect/predict.py:25).
        ops.non_max_suppression = functools.partial(ops.non_max_suppression, max_time_img=args.nms_s_per_image)
    frames = PreprocessStage(target_fps=10.0).run({"video_path": str(real_data() / args.clip)})["frames"]
    frames_bgr = [np.ascontiguousarray(f[..., ::-1]) for f in frames[: args.frames]]
    with tempfile.TemporaryDirectory() as weights:
        made = prepare_detector(Path(weights), args.scale)
        with _full_torch_load(torch):  # as the backend loads it
            detector = ultralytics.YOLO(str(Path(weights) / "detector.pt")).to(args.device)
    for branch in detector.model.model[-1].cv3:
        torch.nn.init.constant_(branch[-1].bias, args.class_bias)
    on_cuda = args.device.startswith("cuda")
    detector(frames_bgr[:1], conf=args.confidence, verbose=False)  # warm-up, not timed
    runs: dict[str, dict] = {}
    reference = None
    for size in [int(c) for c in args.chunks.split(",")]:
        per_call = size or len(frames_bgr)
        if on_cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(args.device)
        t = time.perf_counter()
        boxes = list(detect_in_chunks(detector, frames_bgr, per_call, args.confidence))
        if on_cuda:
            torch.cuda.synchronize()
        run: dict = {"frames_per_call": per_call, "s_per_frame": round((time.perf_counter() - t) / len(frames_bgr), 4)}
        if on_cuda:
            run["torch_peak_allocated_mib"] = round(torch.cuda.max_memory_allocated(args.device) / 2**20, 1)
        run["boxes"] = sum(len(b[0]) for b in boxes)
        if reference is None:
            reference = boxes
        else:
            differ = [
                t
                for t, (a, b) in enumerate(zip(reference, boxes, strict=True))
                if any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, b, strict=True))
            ]
            diffs = [
                float(np.abs(x - y).max())
                for t in differ
                for x, y in zip(reference[t], boxes[t], strict=True)
                if x.shape == y.shape and x.size
            ]
            run.update(identical=not differ, frames_differing=len(differ), max_abs_diff=max(diffs, default=0.0))
        runs[str(size)] = run
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(args.device) if on_cuda else "cpu",
                "torch": torch.__version__,
                "ultralytics": ultralytics.__version__,
                "clip": args.clip,
                "frames": len(frames_bgr),
                "frame_shape": list(frames_bgr[0].shape),
                **made,
                "class_bias": args.class_bias,
                "nms_s_per_image": args.nms_s_per_image,
                "runs": runs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

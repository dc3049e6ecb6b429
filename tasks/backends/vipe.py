"""The ``vipe`` depth backend: y2r's ViPE (hgupt3/vipe) in-process, its ``lyra`` pipeline with field-of-view bounds.

It follows hgupt3/y2r ``dataset_scripts/process_vipe.py``: the pipeline and its model cache
are built once (``create_vipe_pipeline``, lines 177-246) and reused for every video
(``run_vipe_on_video``, lines 280-323). The one difference: the frames reach ViPE from
memory instead of a folder of PNGs, through a stream that reports 30 fps as ViPE's
``FrameDirStream`` does for a folder (vipe/streams/frame_dir_stream.py:57-58), so the
key-frame gaps (``kf_gap_sec``) come out as in y2r.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import Any

import numpy as np

from tasks.backends.base import DepthBackend, DepthOutput, Progress, check_params
from tasks.backends.convert_vipe import stack_vipe_outputs, vipe_overrides
from tasks.backends.upstream import need_dir, need_module, no_downloads
from tasks.backends.vipe_files import check_files

INSTALL = (
    "bash deploy/envs/build.sh vipe  (y2r's ViPE, github.com/hgupt3/vipe, built with USE_SYSTEM_EIGEN=1 "
    "on a machine with CUDA and nvcc)"
)
FILL_CACHE = (
    "Fill it once on a machine with network access: "
    "TORCH_HOME=<weights_dir>/torch HF_HOME=<weights_dir>/huggingface vipe infer any_video.mp4 --pipeline lyra"
)
log = logging.getLogger(__name__)
# The frame rate ViPE assumes for a folder of frames, which is how y2r feeds it.
STREAM_FPS = 30.0


class VipeDepth(DepthBackend):
    """Metric depth, intrinsics and camera->world poses from ViPE; the depth stage inverts the poses.

    ``weights_dir`` holds ViPE's model cache (``torch/`` for torch hub, ``huggingface/`` for
    the HF hub): ViPE fetches its checkpoints through those caches, and the adapter points
    them there and turns the network off, so a worker never downloads at run time.
    Field-of-view bounds are vertical, in degrees (y2r's defaults: 60 to 90).
    """

    local_params = ("weights_dir",)

    name = "vipe"
    packages = ("vipe",)  # whose installed version the provenance records

    def __init__(
        self,
        weights_dir: str | None = None,
        pipeline: str = "lyra",
        fixed_fov_degrees: float | None = None,
        fov_min_degrees: float | None = 60.0,
        fov_max_degrees: float | None = 90.0,
        optimize_intrinsics: bool = True,
        **unknown: Any,
    ) -> None:
        check_params(
            type(self),
            unknown,
            "weights_dir, pipeline, fixed_fov_degrees, fov_min_degrees, fov_max_degrees, optimize_intrinsics",
        )
        super().__init__()
        self.weights_dir = weights_dir
        self.overrides = vipe_overrides(
            pipeline, tempfile.gettempdir(), fixed_fov_degrees, fov_min_degrees, fov_max_degrees, optimize_intrinsics
        )
        self._pipeline: Any = None
        self._api: dict[str, Any] = {}

    def load(self, device: str) -> None:
        """Check the model cache, import ViPE and build its pipeline and model cache once on ``device``."""
        weights = need_dir(self.weights_dir, "ViPE's model cache", "stages.depth.params.weights_dir", FILL_CACHE)
        if "huggingface_hub" in sys.modules:
            # It reads HF_HOME once, at import: another model loaded first in this process wins.
            log.warning(
                "huggingface_hub was imported before ViPE loaded: HF_HOME=%s may not apply; "
                "give the depth stage its own worker (stages.depth.python)",
                weights / "huggingface",
            )
        os.environ["TORCH_HOME"] = str(weights / "torch")
        os.environ["HF_HOME"] = str(weights / "huggingface")
        os.environ["HF_HUB_OFFLINE"] = "1"
        need_module("vipe", "ViPE", INSTALL)
        cache_mod = need_module("vipe.model_cache", "y2r's ViPE (the model cache is not in nv-tlabs/vipe)", INSTALL)
        hydra = need_module("hydra", "hydra-core, which ViPE's configs need", INSTALL)
        base = need_module("vipe.streams.base", "ViPE", INSTALL)
        import torch
        import vipe

        # process_vipe.py:229-244: compose, load every model into the cache, build the pipeline.
        with hydra.initialize_config_dir(config_dir=str(vipe.get_config_path()), version_base=None):
            args = hydra.compose("default", overrides=self.overrides)
        # Every file the pipeline will open, named with where it goes, before the worker takes a task.
        check_files(args.pipeline, weights, FILL_CACHE)
        with no_downloads():
            cache = cache_mod.VipeModelCache.create(
                slam_cfg=args.pipeline.slam,
                init_cfg=args.pipeline.init,
                post_cfg=args.pipeline.post,
                device=torch.device(device),
            )
        self._pipeline = vipe.make_pipeline(args.pipeline, model_cache=cache)
        self._pipeline.return_output_streams = True
        self._api = {"base": base, "torch": torch, "stream": _array_stream_class(base, torch)}
        super().load(device)

    def infer(self, frames: np.ndarray, progress: Progress | None = None) -> DepthOutput:
        """Run ViPE on ``frames`` (T, H, W, 3) uint8 RGB; return depth, [fx, fy, cx, cy] and camera->world poses."""
        if self._pipeline is None:
            raise RuntimeError("VipeDepth.infer called before load(device)")
        base, torch = self._api["base"], self._api["torch"]
        on_cuda = str(self.device).startswith("cuda")
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        stream = self._api["stream"](frames, self.device)
        cached = base.ProcessedVideoStream(stream, []).cache(desc="Reading image frames")
        with no_downloads():
            result = self._pipeline.run(cached)
        output = result.output_streams[0]
        attr = base.FrameAttribute
        poses = [None if p is None else p.matrix().cpu().numpy() for p in output.get_stream_attribute(attr.POSE)]
        depths = [None if d is None else d.cpu().numpy() for d in output.get_stream_attribute(attr.METRIC_DEPTH)]
        intr = [None if k is None else k.cpu().numpy() for k in output.get_stream_attribute(attr.INTRINSICS)]
        if on_cuda:
            self.peak_memory_bytes = int(torch.cuda.max_memory_allocated(self.device))
        if progress is not None:
            progress(len(frames), len(frames))
        out = stack_vipe_outputs(poses, depths, intr, frames.shape[:3])
        return {"depths": out["depths"], "intrinsics": out["intrinsics"], "cam_to_world": out["cam_to_world"]}


def _array_stream_class(base: Any, torch: Any) -> type:
    """Return a ViPE ``VideoStream`` over frames in memory: RGB in [0, 1] as ``FrameDirStream`` yields them."""

    class ArrayStream(base.VideoStream):
        def __init__(self, frames: np.ndarray, device: str) -> None:
            super().__init__()
            self.frames = frames
            self.device = device

        def frame_size(self) -> tuple[int, int]:
            return int(self.frames.shape[1]), int(self.frames.shape[2])

        def fps(self) -> float:
            return STREAM_FPS

        def name(self) -> str:
            return "frames"

        def __len__(self) -> int:
            return len(self.frames)

        def __iter__(self) -> Any:
            # vipe/streams/frame_dir_stream.py:102-106: float RGB / 255 on the device.
            for i, frame in enumerate(self.frames):
                rgb = torch.as_tensor(np.ascontiguousarray(frame)).float().div(255.0).to(self.device)
                yield base.VideoFrame(raw_frame_idx=i, rgb=rgb)

    return ArrayStream

"""The ``tapip3d`` tracks backend: TAPIP3D from a checkout and its checkpoint, called per window as y2r does.

It follows hgupt3/y2r ``dataset_scripts/process_tapip3d.py``: TAPIP3D's ``utils/inference_utils.py``
is imported by file path from the checkout (lines 48-58, its ``utils`` name clashes),
the model is loaded once (lines 1006-1011), and each window runs forward only, with the
caller's queries and no extra grid, under bfloat16 autocast (lines 335-347, 485-496).
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from tasks.backends.base import TrackBackend, check_params
from tasks.backends.convert_tracks import tapip3d_to_first_camera, tapip3d_window_inputs
from tasks.backends.upstream import inside, inside_folder, need_dir, need_file, no_downloads
from tasks.errors import BadInput, ModelLoadError

CHECKOUT = "git clone https://github.com/zbw001/TAPIP3D <repo_dir> && bash deploy/envs/build.sh tapip3d"
CHECKPOINT_URL = "https://huggingface.co/zbww/tapip3d/resolve/main/tapip3d_final.pth"
# utils/inference_utils.py:121-124: the depth range of interest is set from torch.kthvalue of the window's
# positive depths at 25 % and 75 %, which raises unless k = int(0.25 n) >= 1, i.e. n >= 4.
MIN_POSITIVE_DEPTHS = 4


def check_depth_roi(depths: np.ndarray) -> None:
    """Raise BadInput unless ``depths`` (L, H, W) metres holds the positive values TAPIP3D's depth range needs.

    y2r does not guard this: upstream's ``kthvalue`` raises and y2r's worker fails the video
    (process_tapip3d.py:1017-1028). Here the video fails too, permanently (quarantined with this reason).
    """
    positive = int(np.count_nonzero(np.asarray(depths) > 0))
    if positive < MIN_POSITIVE_DEPTHS:
        raise BadInput(
            f"tapip3d: a window of {len(depths)} frames holds {positive} pixels of positive depth; TAPIP3D sets its "
            f"depth range from their quartiles (utils/inference_utils.py:121-124) and needs at least "
            f"{MIN_POSITIVE_DEPTHS}. The depth stage found (almost) no depth in these frames: check the video "
            "(a blank or covered camera) or its depth output."
        )


class Tapip3dTracker(TrackBackend):
    """3D tracks of one window in the window's first camera frame (metres), NaN for points TAPIP3D lost.

    ``repo_dir`` is the TAPIP3D checkout; ``weights_dir`` holds ``checkpoint`` (default: the
    checkout's ``checkpoints/``). ``visibility_threshold`` (0-1, y2r's 0.0) drops a point not
    visible at every step; ``resolution_factor`` (y2r's 1) is y2r's setting, which has no effect
    (TAPIP3D sets the image size to the video's on every call).
    """

    local_params = ("repo_dir", "weights_dir")

    name = "tapip3d"

    def __init__(
        self,
        repo_dir: str | None = None,
        weights_dir: str | None = None,
        checkpoint: str = "tapip3d_final.pth",
        num_iters: int = 6,
        visibility_threshold: float = 0.0,
        resolution_factor: float = 1.0,
        **unknown: Any,
    ) -> None:
        check_params(
            type(self),
            unknown,
            "repo_dir, weights_dir, checkpoint, num_iters, visibility_threshold, resolution_factor",
        )
        super().__init__()
        self.repo_dir = repo_dir
        self.weights_dir = weights_dir
        self.checkpoint = checkpoint
        self.num_iters = int(num_iters)
        self.visibility_threshold = float(visibility_threshold)
        self.resolution_factor = float(resolution_factor)
        self._model: Any = None
        self._inference: Any = None
        self._torch: Any = None

    def load(self, device: str) -> None:
        """Check the checkout and checkpoint, import TAPIP3D's inference module from the checkout, load the model."""
        repo = need_dir(self.repo_dir, "the TAPIP3D checkout", "stages.tracks.params.repo_dir", f"Run: {CHECKOUT}")
        module_path = need_file(
            repo / "utils" / "inference_utils.py", "TAPIP3D's inference module", f"Is it a TAPIP3D checkout? {CHECKOUT}"
        )
        weights = Path(self.weights_dir).expanduser() if self.weights_dir else repo / "checkpoints"
        ckpt = need_file(
            inside_folder(weights, self.checkpoint, "stages.tracks.params.checkpoint"),
            "the TAPIP3D checkpoint",
            f"Download it: wget {CHECKPOINT_URL} -P {weights}",
        )
        try:
            import torch
        except ImportError as exc:
            raise ModelLoadError(f"torch is not installed in this environment; {CHECKOUT}") from exc
        with inside(repo):
            spec = importlib.util.spec_from_file_location("tapip3d_inference_utils", module_path)
            if spec is None or spec.loader is None:
                raise ModelLoadError(f"cannot import {module_path}; {CHECKOUT}")
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except ImportError as exc:
                raise ModelLoadError(
                    f"TAPIP3D's dependencies are not installed ({exc}); install them into this stage's "
                    f"environment: {CHECKOUT}"
                ) from exc
            # A checkpoint whose cfg.model.encoder.pretrained is true makes TAPIP3D call torch.hub.load
            # (models/encoders/cotracker_cnn.py:24-25): offline, that is a start-up error naming the cache.
            with no_downloads():
                model = module.load_model(str(ckpt))
        model.to(device)
        model.eval()
        if self.resolution_factor != 1.0:
            # process_tapip3d.py:410-414: the inference size grows with sqrt(resolution_factor). It has no
            # effect, in y2r as here: TAPIP3D's inference() sets the image size to the video's on every call
            # (utils/inference_utils.py:136).
            base_h, base_w = model.image_size
            scale = float(np.sqrt(self.resolution_factor))
            model.set_image_size((int(base_h * scale), int(base_w * scale)))
        self._model, self._inference, self._torch = model, module.inference, torch
        super().load(device)

    def track(
        self,
        frames: np.ndarray,
        queries: np.ndarray,
        depths: np.ndarray,
        intrinsics: np.ndarray,
        extrinsics: np.ndarray,
        query_pixels: np.ndarray | None = None,
        masks: np.ndarray | None = None,
    ) -> np.ndarray:
        """Track ``queries`` (N, 3), first-camera frame, through one window; return (L, N, 3) float32 in that frame."""
        if self._model is None:
            raise RuntimeError("Tapip3dTracker.track called before load(device)")
        torch = self._torch
        L = len(frames)
        query_point, poses = tapip3d_window_inputs(queries, extrinsics)
        if len(query_point) == 0:
            return np.zeros((L, 0, 3), np.float32)
        check_depth_roi(depths)
        dev = self.device
        # process_tapip3d.py:450-459: (T, C, H, W) in [0, 1], float depths and cameras.
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float().div(255.0).to(dev)
        on_cuda = str(dev).startswith("cuda")
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else contextlib.nullcontext()
        with autocast:
            coords, visibs = self._inference(
                model=self._model,
                video=video,
                depths=torch.from_numpy(np.asarray(depths, np.float32)).to(dev),
                intrinsics=torch.from_numpy(np.asarray(intrinsics, np.float32)).to(dev),
                extrinsics=torch.from_numpy(poses).to(dev),
                query_point=torch.from_numpy(query_point).to(dev),
                num_iters=self.num_iters,
                grid_size=0,
                bidrectional=False,  # upstream's spelling; queries are at t = 0, so forward only
                vis_threshold=self.visibility_threshold,
            )
        if on_cuda:
            self.peak_memory_bytes = int(torch.cuda.max_memory_allocated(dev))
        coords_np = coords.float().cpu().numpy().reshape(L, -1, 3)
        visible_np = visibs.cpu().numpy().reshape(L, -1)
        return tapip3d_to_first_camera(coords_np, visible_np, poses[0])

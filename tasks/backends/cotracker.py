"""The ``cotracker`` 2D tracks backend: CoTracker3 offline from a local checkpoint, tracking both ways, as in y2r.

y2r (hgupt3/y2r ``thirdparty/cotracker3/tap.py:47-53``) calls the predictor with a 64-point
grid on the eroded mask (``grid_size`` + ``segm_mask``); this backend receives the query
pixels instead, so the tracks stage computes that same grid (``convert_tracks.grid_on_mask``)
and the predictor gets them as explicit ``queries``. Both paths add CoTracker's 6x6
support grid (predictor.py:63) and, at CoTracker3's 384x512 resolution, track the same
points. The model is built from the checkpoint file as ``hubconf.py:40-47`` builds
``cotracker3_offline`` (window 60, v3), without the hub download.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.backends.base import Track2DBackend, Tracks2DOutput, check_params
from tasks.backends.convert_tracks import cotracker_queries, cotracker_visible, drop_not_always_visible
from tasks.backends.upstream import inside_folder, need_dir, need_file, need_module, no_downloads

INSTALL = "bash deploy/envs/build.sh cotracker  (pip install git+https://github.com/facebookresearch/co-tracker)"
CHECKPOINT_URL = "https://huggingface.co/facebook/cotracker3/resolve/main/scaled_offline.pth"


class CoTrackerTracks2D(Track2DBackend):
    """2D tracks (L, N, 2) pixels and visibility (L, N) of query pixels of a window's first frame.

    A point not visible at every step has NaN tracks: y2r drops it (tap.py:58-76).

    ``weights_dir`` holds ``checkpoint`` (CoTracker3's ``scaled_offline.pth``);
    ``visibility_threshold`` is y2r's 0.95 (a step is visible above it).
    """

    local_params = ("weights_dir",)

    name = "cotracker"
    packages = ("cotracker",)  # whose installed version the provenance records

    def __init__(
        self,
        weights_dir: str | None = None,
        checkpoint: str = "scaled_offline.pth",
        visibility_threshold: float = 0.95,
        window_len: int = 60,
        **unknown: Any,
    ) -> None:
        check_params(type(self), unknown, "weights_dir, checkpoint, visibility_threshold, window_len")
        super().__init__()
        self.weights_dir = weights_dir
        self.checkpoint = checkpoint
        self.visibility_threshold = float(visibility_threshold)
        self.window_len = int(window_len)
        self._model: Any = None
        self._torch: Any = None

    def load(self, device: str) -> None:
        """Check the checkpoint, import CoTracker and build the offline predictor on ``device``."""
        weights = need_dir(
            self.weights_dir,
            "CoTracker3's weights folder",
            "stages.tracks2d.params.weights_dir",
            f"Download the checkpoint into it: wget {CHECKPOINT_URL}",
        )
        ckpt = need_file(
            inside_folder(weights, self.checkpoint, "stages.tracks2d.params.checkpoint"),
            "the CoTracker3 offline checkpoint",
            f"Download it: wget {CHECKPOINT_URL} -P {weights}",
        )
        predictor = need_module("cotracker.predictor", "CoTracker3", INSTALL)
        import torch

        with no_downloads():
            model = predictor.CoTrackerPredictor(
                checkpoint=str(ckpt), offline=True, window_len=self.window_len, v2=False
            )
        self._model = model.to(device).eval()
        self._torch = torch
        super().load(device)

    def track2d(self, frames: np.ndarray, query_pixels: np.ndarray, masks: np.ndarray | None = None) -> Tracks2DOutput:
        """Track ``query_pixels`` (N, 2) of step 0 through ``frames`` (L, H, W, 3) uint8, forward and backward."""
        if self._model is None:
            raise RuntimeError("CoTrackerTracks2D.track2d called before load(device)")
        torch = self._torch
        L = len(frames)
        q = cotracker_queries(query_pixels)
        if q.shape[1] == 0:
            return {"tracks": np.zeros((L, 0, 2), np.float32), "visible": np.zeros((L, 0), bool)}
        dev = self.device
        # process_cotracker.py:50 and tap.py:32-44: (1, T, C, H, W) float in 0-255.
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()[None].to(dev)
        on_cuda = str(dev).startswith("cuda")
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        with torch.no_grad():
            tracks, visibility = self._model(video, queries=torch.from_numpy(q).to(dev), backward_tracking=True)
        if on_cuda:
            self.peak_memory_bytes = int(torch.cuda.max_memory_allocated(dev))
        visible = cotracker_visible(visibility.cpu().numpy(), self.visibility_threshold)
        tracks_np = tracks.float().cpu().numpy().reshape(L, -1, 2)
        return {"tracks": drop_not_always_visible(tracks_np, visible), "visible": visible}

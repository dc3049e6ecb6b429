"""Stand-in for facebookresearch/co-tracker ``cotracker/predictor.py``: ``CoTrackerPredictor`` with its signature.

Each query moves by (1.5, -0.5) px per step; like upstream it returns booleans for the
visibility (its own > 0.9): a point whose index is 3 mod 7 is hidden at step 5.
"""

from __future__ import annotations

from pathlib import Path

import torch


class CoTrackerPredictor(torch.nn.Module):
    def __init__(
        self,
        checkpoint: str = "./checkpoints/scaled_offline.pth",
        offline: bool = True,
        v2: bool = False,
        window_len: int = 60,
    ) -> None:
        super().__init__()
        if checkpoint is not None and not Path(checkpoint).is_file():
            raise FileNotFoundError(checkpoint)
        self.interp_shape = (384, 512)
        self.offline = offline

    @torch.no_grad()
    def forward(self, video, queries=None, segm_mask=None, grid_size=0, grid_query_frame=0, backward_tracking=False):
        B, T, C, H, W = video.shape
        if C != 3 or float(video.max()) <= 1.0:
            raise ValueError("video must be (B, T, 3, H, W) in 0-255")
        if queries is None or queries.shape[-1] != 3:
            raise ValueError("the stand-in takes explicit (B, N, 3) queries")
        N = queries.shape[1]
        steps = torch.arange(T, dtype=torch.float32, device=video.device)[None, :, None, None]
        tracks = queries[:, None, :, 1:] + steps * torch.tensor([1.5, -0.5], device=video.device)
        visible = torch.ones(B, T, N, dtype=torch.bool, device=video.device)
        hidden = torch.arange(N, device=video.device) % 7 == 3
        if T > 5:
            visible[:, 5, hidden] = False
        return tracks, visible

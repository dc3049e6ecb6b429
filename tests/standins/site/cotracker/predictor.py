"""Stand-in for facebookresearch/co-tracker ``cotracker/predictor.py``: ``CoTrackerPredictor`` around its model.

As upstream (predictor.py at the pinned commit): the video is resized to the model's 384x512
(lines 103-108) and the queries scaled to it (110-118), a grid of ``grid_size`` on the mask is
the query set when no queries are given (119-145), a 6x6 support grid is added when
``grid_size`` is 0 or a mask is given (147-155) and removed after (164-166), visibility is
``> 0.9`` (167-168), each query's own frame is overwritten with the query (174-184), and the
tracks are scaled back to the video's size (186-188). Nothing checks the video's range: the
model maps 0-255 to [-1, 1] (cotracker3_offline.py:64), so a video in [0, 1] runs, wrongly.

The "model": each point moves by (1.5, -0.5) px per step at the model's resolution from its
query frame; a query whose index is 3 mod 7 is hidden at step 5. ``model_queries`` keeps the
last query set the model saw (support grid included), at the model's resolution.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F


def get_points_on_a_grid(size: int, extent, device=None) -> torch.Tensor:
    """Upstream's grid (cotracker/models/core/model_utils.py:83-140): (1, size*size, 2) (x, y), margin W/64."""
    if size == 1:
        return torch.tensor([extent[1] / 2, extent[0] / 2], device=device)[None, None]
    margin = extent[1] / 64
    range_y = (margin - extent[0] / 2 + extent[0] / 2, extent[0] / 2 + extent[0] / 2 - margin)
    range_x = (margin - extent[1] / 2 + extent[1] / 2, extent[1] / 2 + extent[1] / 2 - margin)
    grid_y, grid_x = torch.meshgrid(
        torch.linspace(*range_y, size, device=device), torch.linspace(*range_x, size, device=device), indexing="ij"
    )
    return torch.stack([grid_x, grid_y], dim=-1).reshape(1, -1, 2)


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
        self.support_grid_size = 6
        self.interp_shape = (384, 512)
        self.offline = offline
        self.model_queries: torch.Tensor | None = None

    @torch.no_grad()
    def forward(self, video, queries=None, segm_mask=None, grid_size=0, grid_query_frame=0, backward_tracking=False):
        if queries is None and grid_size == 0:
            raise NotImplementedError("the stand-in has no dense tracking")
        B, T, C, H, W = video.shape
        ih, iw = self.interp_shape
        video = F.interpolate(video.reshape(B * T, C, H, W), (ih, iw), mode="bilinear", align_corners=True)
        if queries is not None:
            queries = queries.clone().float()
            queries[:, :, 1:] *= queries.new_tensor([(iw - 1) / (W - 1), (ih - 1) / (H - 1)])
        else:
            grid = get_points_on_a_grid(grid_size, self.interp_shape, device=video.device)
            if segm_mask is not None:
                segm_mask = F.interpolate(segm_mask, (ih, iw), mode="nearest")
                on = segm_mask[0, 0][grid[0, :, 1].round().long().cpu(), grid[0, :, 0].round().long().cpu()].bool()
                grid = grid[:, on]
            queries = torch.cat([torch.ones_like(grid[:, :, :1]) * grid_query_frame, grid], dim=2).repeat(B, 1, 1)
        N = queries.shape[1]
        add_support_grid = grid_size == 0 or segm_mask is not None
        if add_support_grid:
            support = get_points_on_a_grid(self.support_grid_size, self.interp_shape, device=video.device)
            support = torch.cat([torch.zeros_like(support[:, :, :1]), support], dim=2).repeat(B, 1, 1)
            queries = torch.cat([queries, support], dim=1)
        self.model_queries = queries.clone()
        steps = torch.arange(T, dtype=torch.float32, device=video.device)[None, :, None, None]
        since = steps - queries[:, None, :, :1]
        tracks = queries[:, None, :, 1:] + since * torch.tensor([1.5, -0.5], device=video.device)
        vis = torch.ones(B, T, queries.shape[1], device=video.device)
        hidden = torch.arange(queries.shape[1], device=video.device) % 7 == 3
        hidden[N:] = False
        if T > 5:
            vis[:, 5, hidden] = 0.0
        if add_support_grid:
            tracks, vis = tracks[:, :, :N], vis[:, :, :N]
            queries = queries[:, :N]
        visible = vis > 0.9
        for i in range(len(queries)):
            queries_t = queries[i, :, 0].to(torch.int64)
            arange = torch.arange(0, len(queries_t))
            tracks[i, queries_t, arange] = queries[i, :, 1:]
            visible[i, queries_t, arange] = True
        tracks *= tracks.new_tensor([(W - 1) / (iw - 1), (H - 1) / (ih - 1)])
        return tracks, visible

"""Stand-in for zbw001/TAPIP3D ``utils/inference_utils.py``: ``load_model`` and ``inference`` with their signatures.

``inference`` returns world-frame coordinates (T, N, 3), squeezed as upstream does: each
query drifts by (0.01, 0.005, 0) m per step in the world its ``extrinsics`` define; the
visibility is ``sigmoid(logit) >= vis_threshold``, with a logit of -5 from step 6 on for
points whose index is 4 mod 11 (kept at y2r's threshold 0.0, dropped at 0.5).
"""

from __future__ import annotations

from pathlib import Path

import models
import torch


def load_model(checkpoint_path: str):
    if not Path(checkpoint_path).is_file():
        raise FileNotFoundError(f"Checkpoint file not found: {checkpoint_path}")
    model = models.PointTracker3D()
    model.eval()
    return model


@torch.no_grad()
def inference(
    *,
    model,
    video,
    depths,
    intrinsics,
    extrinsics,
    query_point,
    num_iters=6,
    grid_size=8,
    bidrectional=True,
    vis_threshold=0.9,
):
    T, C, H, W = video.shape
    assert depths.shape == (T, H, W)
    assert intrinsics.shape == (T, 3, 3) and extrinsics.shape == (T, 4, 4)
    assert float(video.max()) <= 1.0, "video must be in [0, 1]"
    assert (query_point[:, 0] == 0).all(), "the stand-in tracks forward from t = 0"
    model.set_image_size((H, W))
    N = query_point.shape[0]
    steps = torch.arange(T, dtype=torch.float32, device=video.device)[:, None, None]
    coords = query_point[None, :, 1:].float() + steps * torch.tensor([0.01, 0.005, 0.0], device=video.device)
    logits = torch.full((T, N), 5.0, device=video.device)
    lost = torch.arange(N, device=video.device) % 11 == 4
    logits[6:, lost] = -5.0
    visibs = torch.sigmoid(logits) >= vis_threshold
    return coords.squeeze(), visibs.squeeze()

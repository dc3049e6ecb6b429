"""Stand-in for zbw001/TAPIP3D ``utils/inference_utils.py``: ``load_model`` and ``inference`` with their signatures.

``load_model`` reads the checkpoint as upstream's ``models.from_pretrained`` does
(models/__init__.py:31-40: ``torch.load(..., weights_only=False)``, a dict with ``cfg`` and
``weight``), so placeholder bytes fail; when ``cfg.model.encoder.pretrained`` is true upstream's
``CoTrackerCNNEncoder`` calls ``torch.hub.load("facebookresearch/co-tracker", "cotracker3_offline")``
(models/encoders/cotracker_cnn.py:24-25), and so does this stand-in.

``inference`` first computes the depth range of interest as upstream does (inference_utils.py:121-130:
``torch.kthvalue`` of the positive depths at 25 % and 75 %, which raises with fewer than 4), then
returns world-frame coordinates (T, N, 3), squeezed as upstream does: each query drifts by
(0.01, 0.005, 0) m per step in the world its ``extrinsics`` define; the visibility is
``sigmoid(logit) >= vis_threshold``, with a logit of -5 from step 6 on for points whose index
is 4 mod 11 (kept at y2r's threshold 0.0, dropped at 0.5). It always calls ``set_image_size``
with the video's size (line 136), so a size set before has no effect.
"""

from __future__ import annotations

from pathlib import Path

import models
import torch


def load_model(checkpoint_path: str):
    if not Path(checkpoint_path).is_file():
        raise FileNotFoundError(f"Checkpoint file not found: {checkpoint_path}")
    ckpt = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    if "cfg" not in ckpt:
        raise ValueError("Unsupported checkpoint")
    cfg = ckpt["cfg"]
    if cfg["model"]["encoder"].get("pretrained"):
        torch.hub.load("facebookresearch/co-tracker", "cotracker3_offline")
    model = models.PointTracker3D(image_size=tuple(cfg["train_dataset"]["resolution"]))
    model.load_state_dict(ckpt["weight"], strict=True)
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
    _depths = depths.clone()
    _depths = _depths[_depths > 0].reshape(-1)
    q25 = torch.kthvalue(_depths, int(0.25 * len(_depths))).values
    q75 = torch.kthvalue(_depths, int(0.75 * len(_depths))).values
    assert torch.isfinite(q75 + 1.5 * (q75 - q25))
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

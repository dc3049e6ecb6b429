"""Stand-in for rolpotamias/WiLoR ``wilor/models``: ``load_wilor`` as upstream's, a model with its shapes.

``load_wilor`` reads MANO from ./mano_data/ (wilor/models/__init__.py:28-33) and the checkpoint
as pytorch-lightning 2.6 does: ``torch.load(f, map_location=..., weights_only=None)``
(lightning_fabric/utilities/cloud_io.py:74-79), which torch >= 2.6 reads as weights-only, so a
checkpoint holding its config object (WiLoR's holds a yacs CfgNode) fails unless the caller
lets it unpickle. The model takes crops of (3, 256, 256) and slices them to 192 wide
(wilor/models/wilor.py:111). Its crop camera is ``[0.5, 0, 0]`` so the wrist projects to the
box centre; global orient is Rz(box centre x / 1000); its keypoints are MANO's joints, which
MANO has already rotated by the global orient (wilor.py:143-150), relative to the wrist;
betas 0.1 k + box size / 1e4.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from wilor import utils as _utils  # noqa: F401  (upstream's wilor/models/wilor.py:7 imports the renderers)

# The hand's joints before the global orient (wrist at the origin, fingers along -y).
CANONICAL_JOINTS = torch.zeros(21, 3)
CANONICAL_JOINTS[1:, 1] = -0.01 * torch.arange(1, 21, dtype=torch.float32)
CANONICAL_JOINTS[1:, 0] = 0.005 * (torch.arange(1, 21) % 4).float()


class WiLoR(torch.nn.Module):
    def forward(self, batch):
        B = batch["img"].shape[0]
        if batch["img"].shape[1:] != (3, 256, 256):
            raise ValueError(f"crops must be (3, 256, 256), got {tuple(batch['img'].shape[1:])}")
        x = batch["img"][:, :, :, 32:-32]  # what the ViT backbone sees: (3, 256, 192)
        assert x.shape[1:] == (3, 256, 192)
        dev = batch["box_center"].device  # outputs on the batch's device, as the real model's
        angle = batch["box_center"][:, 0].float() / 1000.0
        orient = torch.zeros(B, 1, 3, 3, device=dev)
        orient[:, 0, 0, 0], orient[:, 0, 0, 1] = torch.cos(angle), -torch.sin(angle)
        orient[:, 0, 1, 0], orient[:, 0, 1, 1] = torch.sin(angle), torch.cos(angle)
        orient[:, 0, 2, 2] = 1.0
        keypoints = CANONICAL_JOINTS.to(dev)[None] @ orient[:, 0].transpose(1, 2)  # MANO applies the global orient
        betas = 0.1 * torch.arange(10, dtype=torch.float32, device=dev)[None] + batch["box_size"].float()[:, None] / 1e4
        return {
            "pred_mano_params": {
                "global_orient": orient,
                "hand_pose": torch.eye(3).repeat(B, 15, 1, 1),
                "betas": betas,
            },
            "pred_keypoints_3d": keypoints,
            "pred_vertices": torch.zeros(B, 778, 3),
            "pred_cam": torch.tensor([0.5, 0.0, 0.0]).repeat(B, 1),
        }


def load_wilor(checkpoint_path, cfg_path):
    for path in (checkpoint_path, cfg_path):
        if not Path(path).is_file():
            raise FileNotFoundError(path)
    mano = Path("./mano_data/MANO_RIGHT.pkl")
    if not mano.is_file():  # smplx's message when MANO is missing
        raise AssertionError(f"Path {mano} does not exist!")
    with open(checkpoint_path, "rb") as f:
        torch.load(f, map_location="cpu", weights_only=None)  # pytorch-lightning 2.6's call
    cfg = SimpleNamespace(EXTRA=SimpleNamespace(FOCAL_LENGTH=5000), MODEL=SimpleNamespace(IMAGE_SIZE=256))
    return WiLoR(), cfg

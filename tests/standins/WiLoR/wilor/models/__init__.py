"""Stand-in for rolpotamias/WiLoR ``wilor/models``: ``load_wilor`` reads MANO from ./mano_data/ as upstream does.

The model's crop camera is ``[0.5, 0, 0]`` so the wrist projects to the box centre;
global orient is Rz(box centre x / 1000); betas 0.1 k + box size / 1e4.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch


class WiLoR(torch.nn.Module):
    def forward(self, batch):
        B = batch["img"].shape[0]
        if batch["img"].shape[1:] != (3, 256, 192):
            raise ValueError("crops must be (3, 256, 192)")
        dev = batch["box_center"].device  # outputs on the batch's device, as the real model's
        angle = batch["box_center"][:, 0].float() / 1000.0
        orient = torch.zeros(B, 1, 3, 3, device=dev)
        orient[:, 0, 0, 0], orient[:, 0, 0, 1] = torch.cos(angle), -torch.sin(angle)
        orient[:, 0, 1, 0], orient[:, 0, 1, 1] = torch.sin(angle), torch.cos(angle)
        orient[:, 0, 2, 2] = 1.0
        keypoints = torch.zeros(B, 21, 3)
        keypoints[:, 1:, 1] = -0.01 * torch.arange(1, 21, dtype=torch.float32)  # fingers along -y
        keypoints[:, 1:, 0] = 0.005 * (torch.arange(1, 21) % 4).float()
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
    cfg = SimpleNamespace(EXTRA=SimpleNamespace(FOCAL_LENGTH=5000), MODEL=SimpleNamespace(IMAGE_SIZE=256))
    return WiLoR(), cfg

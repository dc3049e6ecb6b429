"""Stand-in for TAPIP3D's ``models`` package (imported by ``utils/inference_utils.py`` from the checkout root)."""

from __future__ import annotations

import torch


class PointTracker3D(torch.nn.Module):
    def __init__(self, image_size=(384, 512)) -> None:
        super().__init__()
        self.image_size = tuple(image_size)
        self.bidirectional = False
        self.scale = torch.nn.Parameter(torch.ones(1))

    def set_image_size(self, size) -> None:
        self.image_size = tuple(size)

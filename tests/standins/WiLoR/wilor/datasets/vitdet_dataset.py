"""Stand-in for WiLoR's ``ViTDetDataset``: one item per box with upstream's keys and types."""

from __future__ import annotations

import numpy as np


class ViTDetDataset:
    def __init__(self, cfg, img_cv2, boxes, right, rescale_factor=2.5, train=False, **kwargs):
        self.img = img_cv2
        self.boxes = np.asarray(boxes, dtype=np.float32)
        self.right = np.asarray(right, dtype=np.float32)
        self.center = (self.boxes[:, 2:4] + self.boxes[:, 0:2]) / 2.0
        self.scale = rescale_factor * (self.boxes[:, 2:4] - self.boxes[:, 0:2]) / 200.0

    def __len__(self) -> int:
        return len(self.boxes)

    def __getitem__(self, idx: int) -> dict:
        bbox_size = (self.scale[idx] * 200).max()  # a NumPy scalar, as upstream's
        return {
            "img": np.zeros((3, 256, 192), np.float32),
            "personid": int(idx),
            "box_center": self.center[idx].copy(),
            "box_size": bbox_size,
            "img_size": 1.0 * np.array([self.img.shape[1], self.img.shape[0]]),
            "right": self.right[idx].copy(),
        }

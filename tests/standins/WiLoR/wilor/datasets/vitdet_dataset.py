"""Stand-in for WiLoR's ``ViTDetDataset``: one item per box with upstream's keys, types and crop size.

Upstream crops a square patch of ``cfg.MODEL.IMAGE_SIZE`` (256) on each side
(wilor/datasets/vitdet_dataset.py:33 and 57), flipped for a left hand (line 60); the model
then slices the width to 192 (wilor/models/wilor.py:111).
"""

from __future__ import annotations

import numpy as np


class ViTDetDataset:
    def __init__(self, cfg, img_cv2, boxes, right, rescale_factor=2.5, train=False, **kwargs):
        assert train is False, "ViTDetDataset is only for inference"
        self.img_size = int(cfg.MODEL.IMAGE_SIZE)
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
            "img": np.zeros((3, self.img_size, self.img_size), np.float32),
            "personid": int(idx),
            "box_center": self.center[idx].copy(),
            "box_size": bbox_size,
            "img_size": 1.0 * np.array([self.img.shape[1], self.img.shape[0]]),
            "right": self.right[idx].copy(),
        }

"""Stand-in for ultralytics' ``YOLO`` as WiLoR's hand detector: results with ``boxes.xyxy``, ``.conf``, ``.cls``.

As upstream (ultralytics 8.1.34), a call takes one (H, W, 3) BGR array or a list of them and runs the
whole list as one batch (data/build.py:140-142 and 178-179, data/loaders.py:404-433), but each image's
boxes depend on that image alone: the letterbox is the same for every image of one size
(engine/predictor.py:154-156, data/augment.py:715-716), the network is per image, and NMS and the
box scaling loop over the images (utils/ops.py:236, models/yolo/detect/predict.py:38-40). So the
boxes here are a function of the image's pixels, never of its place in the call. With ``m`` the
mean of the image's bytes and ``s`` their sum: two right hands (0.9 and 0.8 confidence; the first is
the one to keep) the first centred at x = 0.62 W + 15 sin(m / 3), a left hand (0.85) unless
s % 5 == 2, and a left hand at 0.5 that the confidence threshold drops.

``batch_sizes`` is the stand-in's own record of how many images each call ran as one batch (upstream
has no such attribute): what a test reads to know the batch the model saw.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


def right_hand_x(image: np.ndarray) -> float:
    """The x (pixels) of the kept right hand's box centre in ``image`` (H, W, 3)."""
    total = int(image.sum(dtype=np.int64))  # exact, whatever the order of the channels
    return 0.62 * image.shape[1] + 15 * math.sin(total / image.size / 3.0)


def has_left_hand(image: np.ndarray) -> bool:
    """Whether the 0.85 left hand is in ``image``."""
    return int(image.sum(dtype=np.int64)) % 5 != 2


class YOLO:
    def __init__(self, model: str) -> None:
        if not Path(model).is_file():
            raise FileNotFoundError(model)
        self.device = "cpu"
        self.batch_sizes: list[int] = []

    def to(self, device):
        self.device = str(device)
        return self

    def __call__(self, source, conf: float = 0.25, verbose: bool = True):
        images = list(source) if isinstance(source, (list, tuple)) else [source]  # build.py:140-142, loaders.py:406-407
        self.batch_sizes.append(len(images))
        return [self._one(image, conf) for image in images]

    @staticmethod
    def _one(image, conf: float):
        if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError("YOLO takes (H, W, 3) BGR frames")
        H, W = image.shape[:2]
        rx, lx = right_hand_x(image), 0.35 * W
        rows = [
            (rx - 40, 0.52 * H - 40, rx + 40, 0.52 * H + 40, 0.9, 1.0),
            (rx - 60, 0.3 * H - 30, rx + 0, 0.3 * H + 30, 0.8, 1.0),
            (lx - 20, 0.8 * H - 20, lx + 20, 0.8 * H + 20, 0.5, 0.0),
        ]
        if has_left_hand(image):
            rows.append((lx - 40, 0.55 * H - 40, lx + 40, 0.55 * H + 40, 0.85, 0.0))
        kept = torch.tensor([r for r in rows if r[4] >= conf], dtype=torch.float32).reshape(-1, 6)
        boxes = SimpleNamespace(data=kept, xyxy=kept[:, :4], conf=kept[:, 4], cls=kept[:, 5])
        return SimpleNamespace(boxes=boxes)

"""Stand-in for ultralytics' ``YOLO`` as WiLoR's hand detector: results with ``boxes.xyxy``, ``.conf``, ``.cls``.

Per BGR frame t: two right hands (0.9 and 0.8 confidence; the first is the one to keep),
a left hand (0.85) on frames where t % 5 != 2, and a left hand at 0.5 that the
confidence threshold drops.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


class YOLO:
    def __init__(self, model: str) -> None:
        if not Path(model).is_file():
            raise FileNotFoundError(model)
        self.device = "cpu"

    def to(self, device):
        self.device = str(device)
        return self

    def __call__(self, source, conf: float = 0.25, verbose: bool = True):
        results = []
        for t, frame in enumerate(source):
            if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3:
                raise ValueError("YOLO takes a list of (H, W, 3) BGR frames")
            H, W = frame.shape[:2]
            rx, lx = 0.62 * W + 15 * math.sin(t / 3.0), 0.35 * W
            rows = [
                (rx - 40, 0.52 * H - 40, rx + 40, 0.52 * H + 40, 0.9, 1.0),
                (rx - 60, 0.3 * H - 30, rx + 0, 0.3 * H + 30, 0.8, 1.0),
                (lx - 20, 0.8 * H - 20, lx + 20, 0.8 * H + 20, 0.5, 0.0),
            ]
            if t % 5 != 2:
                rows.append((lx - 40, 0.55 * H - 40, lx + 40, 0.55 * H + 40, 0.85, 0.0))
            kept = torch.tensor([r for r in rows if r[4] >= conf], dtype=torch.float32).reshape(-1, 6)
            boxes = SimpleNamespace(data=kept, xyxy=kept[:, :4], conf=kept[:, 4], cls=kept[:, 5])
            results.append(SimpleNamespace(boxes=boxes))
        return results

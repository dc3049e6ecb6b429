"""Stand-in for transformers' GroundingDINO classes: ``AutoProcessor`` and ``AutoModelForZeroShotObjectDetection``.

The "detector" finds an object only when the prompt names a "block": the box around the
frame's bright pixels (mean RGB > 150), scored 0.9; every other query scores 0.1. Like the
real model it returns ``logits`` (B, Q, 256) and ``pred_boxes`` (B, Q, 4) as normalised
(cx, cy, w, h); the processor's ``post_process_grounded_object_detection`` keeps the queries
scoring above ``threshold`` and converts their boxes to pixel corners at ``target_sizes``
(transformers 4.57, models/grounding_dino/processing_grounding_dino.py:229-266).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

QUERIES = 4


class _Inputs(dict):
    def to(self, device):
        return _Inputs({k: (v.to(device) if hasattr(v, "to") else v) for k, v in self.items()})

    @property
    def input_ids(self):
        return self["input_ids"]


class AutoProcessor:
    @classmethod
    def from_pretrained(cls, path: str) -> AutoProcessor:
        if not Path(path).is_dir():
            raise OSError(f"{path} is not a local snapshot")
        return cls()

    def __call__(self, images, text: str, return_tensors: str = "pt") -> _Inputs:
        pixels = torch.from_numpy(np.asarray(images, dtype=np.float32))
        found = 1 if "block" in text else 0
        return _Inputs(pixel_values=pixels, input_ids=torch.tensor([[found]]))

    def post_process_grounded_object_detection(
        self, outputs, input_ids=None, threshold=0.25, text_threshold=0.25, target_sizes=None, text_labels=None
    ):
        probs = torch.sigmoid(outputs.logits)
        scores = probs.max(dim=-1).values
        cx, cy, w, h = outputs.pred_boxes.unbind(-1)
        boxes = torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)
        if target_sizes is not None:
            img_h = torch.tensor([float(s[0]) for s in target_sizes])
            img_w = torch.tensor([float(s[1]) for s in target_sizes])
            boxes = boxes * torch.stack([img_w, img_h, img_w, img_h], dim=1)[:, None, :]
        results = []
        for s, b in zip(scores, boxes, strict=True):
            keep = s > threshold
            results.append({"scores": s[keep], "boxes": b[keep], "labels": ["block"] * int(keep.sum())})
        return results


class AutoModelForZeroShotObjectDetection(torch.nn.Module):
    @classmethod
    def from_pretrained(cls, path: str) -> AutoModelForZeroShotObjectDetection:
        if not Path(path).is_dir():
            raise OSError(f"{path} is not a local snapshot")
        return cls()

    def forward(self, pixel_values, input_ids):
        H, W = pixel_values.shape[:2]
        logits = torch.full((1, QUERIES, 256), float(np.log(0.1 / 0.9)))
        pred_boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2]] * QUERIES])
        bright = pixel_values.mean(dim=-1) > 150
        if int(input_ids[0, 0]) == 1 and bool(bright.any()):
            ys, xs = torch.nonzero(bright, as_tuple=True)
            x0, x1, y0, y1 = xs.min().item(), xs.max().item() + 1, ys.min().item(), ys.max().item() + 1
            pred_boxes[0, 0] = torch.tensor([(x0 + x1) / 2 / W, (y0 + y1) / 2 / H, (x1 - x0) / W, (y1 - y0) / H])
            logits[0, 0, :2] = float(np.log(0.9 / 0.1))
        return SimpleNamespace(logits=logits, pred_boxes=pred_boxes)

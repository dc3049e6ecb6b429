"""Stand-in for SAM 2's ``build_sam2_video_predictor``: a video predictor whose mask of an object is its box."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image


class _Predictor:
    def init_state(self, video_path: str) -> dict:
        files = sorted(Path(video_path).glob("*.jpg"))
        if not files:
            raise RuntimeError(f"no JPEG frames in {video_path}")
        H, W = np.asarray(Image.open(files[0])).shape[:2]
        return {"num_frames": len(files), "size": (H, W), "boxes": {}}

    def add_new_points_or_box(self, inference_state, frame_idx, obj_id, points=None, labels=None, box=None):
        inference_state["boxes"][obj_id] = np.asarray(box, dtype=np.float32)

    def propagate_in_video(self, inference_state, start_frame_idx=None, max_frame_num_to_track=None, reverse=False):
        H, W = inference_state["size"]
        ys, xs = np.mgrid[0:H, 0:W]
        ids = sorted(inference_state["boxes"])
        logits = []
        for obj in ids:
            x0, y0, x1, y1 = inference_state["boxes"][obj]
            inside = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
            logits.append(np.where(inside, 1.0, -1.0)[None])
        frames = range(start_frame_idx, -1, -1) if reverse else range(start_frame_idx, inference_state["num_frames"])
        for t in frames:
            yield t, ids, torch.tensor(np.stack(logits), dtype=torch.float32)


def build_sam2_video_predictor(config_file: str, ckpt_path: str | None = None, device: str = "cuda", **_: object):
    if ckpt_path is None or not Path(ckpt_path).is_file():
        raise FileNotFoundError(ckpt_path)
    return _Predictor()

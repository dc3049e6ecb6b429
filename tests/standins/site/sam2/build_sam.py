"""Stand-in for SAM 2's ``build_sam2_video_predictor``: a video predictor whose mask of an object is its box.

Like upstream's ``init_state`` (sam2/sam2_video_predictor.py:42-72, sam2/utils/misc.py:213-278) it
reads only files named ``<index>.jpg``/``.jpeg`` (PIL reads whatever they hold) into
``state["images"]`` (T, 3, S, S) and the video's size; the stand-in's S is 64, not 1024.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image


class _Predictor:
    image_size = 64

    def init_state(self, video_path: str) -> dict:
        files = [p for p in Path(video_path).iterdir() if p.suffix in (".jpg", ".jpeg", ".JPG", ".JPEG")]
        files.sort(key=lambda p: int(p.stem))
        if not files:
            raise RuntimeError(f"no images found in {video_path}")
        S = self.image_size
        images = torch.zeros(len(files), 3, S, S)
        for i, f in enumerate(files):
            img = Image.open(f)
            W, H = img.size
            images[i] = torch.from_numpy(np.asarray(img.convert("RGB").resize((S, S))) / 255.0).permute(2, 0, 1)
        return {"images": images, "num_frames": len(files), "video_height": H, "video_width": W, "boxes": {}}

    def add_new_points_or_box(self, inference_state, frame_idx, obj_id, points=None, labels=None, box=None):
        inference_state["boxes"][obj_id] = np.asarray(box, dtype=np.float32)

    def propagate_in_video(self, inference_state, start_frame_idx=None, max_frame_num_to_track=None, reverse=False):
        H, W = inference_state["video_height"], inference_state["video_width"]
        ys, xs = np.mgrid[0:H, 0:W]
        ids = sorted(inference_state["boxes"])
        logits = []
        for obj in ids:
            x0, y0, x1, y1 = np.round(inference_state["boxes"][obj])
            inside = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
            logits.append(np.where(inside, 1.0, -1.0)[None])
        frames = range(start_frame_idx, -1, -1) if reverse else range(start_frame_idx, inference_state["num_frames"])
        for t in frames:
            yield t, ids, torch.tensor(np.stack(logits), dtype=torch.float32)


def build_sam2_video_predictor(config_file: str, ckpt_path: str | None = None, device: str = "cuda", **_: object):
    if ckpt_path is None or not Path(ckpt_path).is_file():
        raise FileNotFoundError(ckpt_path)
    return _Predictor()

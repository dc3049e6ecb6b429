"""WiLoR's crops through rolpotamias/WiLoR's own ``ViTDetDataset`` and config, and our adapter's batching of them.

WiLoR's model (a ViT-H) is too slow for this machine's CPU and needs MANO; what runs here is
upstream's data path as our ``wilor`` adapter calls it: ``get_config`` on the checkout's
``model_config.yaml`` with ``load_wilor``'s crop override (wilor/models/__init__.py:13-18), the
dataset on a real frame at y2r's ``rescale_factor`` 2.0, and the adapter's batches, checked
against what WiLoR's ``forward_step`` reads (wilor/models/wilor.py:104-111). The model is the one
part replaced: it records what it is given.
"""

from __future__ import annotations

import pytest

from tests.upstream.sources import run_python, source

pytestmark = [pytest.mark.upstream, pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = r"""
import json, sys
import numpy as np
import torch
from wilor.configs import get_config
from wilor.datasets.vitdet_dataset import ViTDetDataset
from tasks.backends import get_backend
from tests.backends.real_clips import frames as real_frames

repo = sys.argv[1]
cfg = get_config(f"{repo}/pretrained_models/model_config.yaml", update_cachedir=True)
cfg.defrost()
cfg.MODEL.BBOX_SHAPE = [192, 256]  # load_wilor's override for a ViT backbone
cfg.freeze()
frame_bgr = np.ascontiguousarray(np.array(real_frames("pstudio.mp4", 1))[0][..., ::-1])
boxes = np.array([[200.0, 120.0, 260.0, 200.0], [300.0, 140.0, 350.0, 210.0]])
items = [ViTDetDataset(cfg, frame_bgr, boxes[i : i + 1], np.array([r]), rescale_factor=2.0)[0]
         for i, r in enumerate((1.0, 0.0))]
seen = {}

class Recorder(torch.nn.Module):
    def forward(self, batch):
        seen.update({k: [list(v.shape), str(v.dtype)] for k, v in batch.items()})
        seen["vit_input"] = list(batch["img"][:, :, :, 32:-32].shape)  # wilor.py:111
        B = batch["img"].shape[0]
        return {"pred_mano_params": {"global_orient": torch.eye(3).repeat(B, 1, 1, 1),
                                     "hand_pose": torch.eye(3).repeat(B, 15, 1, 1), "betas": torch.zeros(B, 10)},
                "pred_keypoints_3d": torch.zeros(B, 21, 3), "pred_cam": torch.tensor([[0.9, 0.0, 0.0]]).repeat(B, 1)}

hands = get_backend("hands", "wilor", repo_dir=repo, batch_size=256)
hands.device = "cpu"
hands._api = {"torch": torch, "model": Recorder(), "recursive_to": lambda b, d: b}
raw = list(hands._run_batches(items, None, 1))
print(json.dumps({
    "seen": seen, "n": len(raw), "image_size": cfg.MODEL.IMAGE_SIZE, "focal": cfg.EXTRA.FOCAL_LENGTH,
    "item_types": {k: type(v).__name__ for k, v in items[0].items()},
    "box_size": [float(r["box_size"]) for r in raw], "right": [r["right"] for r in raw],
    "img_size": [r["img_size"].tolist() for r in raw],
    # The same box as a left hand: upstream crops the mirrored image (vitdet_dataset.py:60-80).
    "left_mirrored": float(np.abs(
        ViTDetDataset(cfg, frame_bgr, boxes[:1], np.array([0.0]), rescale_factor=2.0)[0]["img"][..., ::-1]
        - items[0]["img"]).mean()),
}))
"""


def test_wilor_adapter_batches_upstream_crops_as_wilor_reads_them():
    repo = source("rolpotamias+WiLoR")
    res = run_python(SCRIPT, str(repo), path=[repo])
    seen = res["seen"]
    assert seen["img"] == [[2, 3, 256, 256], "torch.float32"]  # a square crop of MODEL.IMAGE_SIZE
    assert res["seen"]["vit_input"] == [2, 3, 256, 192]  # what the ViT backbone sees
    assert seen["box_center"][0] == [2, 2] and seen["img_size"][0] == [2, 2]
    assert seen["box_size"][0] == [2] and seen["right"][0] == [2]
    assert res["n"] == 2 and res["right"] == [1.0, 0.0] and res["img_size"] == [[512.0, 384.0]] * 2
    # The box is expanded to BBOX_SHAPE's aspect (192:256) after the 2.0 rescale: 80 px tall -> 160.
    assert res["box_size"][0] == pytest.approx(160.0)
    assert res["image_size"] == 256 and res["focal"] > 0
    # WiLoR sees a left hand flipped into a right one (what y2r's mirroring and "hand_frame: camera" undo).
    assert res["left_mirrored"] < 0.05

"""Grounded-SAM through the real code: transformers' GroundingDINO and facebookresearch/sam2, random weights.

GroundingDINO is transformers' ``GroundingDinoForObjectDetection`` from a small config (a tiny
Swin and a one-layer BERT with a vocabulary of the prompt's words), saved with
``save_pretrained`` as the Hugging Face snapshot ``grounding-dino-base/`` is laid out; SAM 2.1
is upstream's hiera-tiny config (``SAM2_BUILD_CUDA=0``: no extension, as on a CPU), saved as
``{"model": state_dict}`` as the released ``.pt`` files are. Our ``grounded_sam`` adapter loads
both by path, at y2r's box threshold 0.3, on a real clip.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.upstream.sources import run_python, source

pytestmark = [pytest.mark.upstream, pytest.mark.slow, pytest.mark.timeout(1800)]

BUILD = r"""
import json, sys
from pathlib import Path
import torch
from transformers import (BertConfig, BertTokenizerFast, GroundingDinoConfig, GroundingDinoForObjectDetection,
                          GroundingDinoImageProcessor, GroundingDinoProcessor, SwinConfig)
from sam2.build_sam import build_sam2_video_predictor

weights = Path(sys.argv[1])
snapshot = weights / "grounding-dino-base"
snapshot.mkdir(parents=True)
words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "red", "t", "-", "shaped", "block", "mug"]
(weights / "vocab.txt").write_text("\n".join(words) + "\n")
tokenizer = BertTokenizerFast(vocab_file=str(weights / "vocab.txt"), do_lower_case=True)
torch.manual_seed(0)
config = GroundingDinoConfig(
    backbone_config=SwinConfig(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=7,
                               out_features=["stage2", "stage3", "stage4"]),
    text_config=BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64),
    d_model=64, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
    encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=3, encoder_n_points=2, decoder_n_points=2,
)
GroundingDinoForObjectDetection(config).save_pretrained(snapshot)
GroundingDinoProcessor(image_processor=GroundingDinoImageProcessor(), tokenizer=tokenizer).save_pretrained(snapshot)
sam = build_sam2_video_predictor("configs/sam2.1/sam2.1_hiera_t.yaml", None, device="cpu")
torch.save({"model": sam.state_dict()}, weights / "sam2.1_hiera_tiny.pt")
print(json.dumps({"ok": True}))
"""

RUN = r"""
import json, sys, time
from pathlib import Path
import numpy as np
import torch
from tasks.backends import get_backend
from tasks.backends.grounded_sam import sam2_images
from tests.backends.real_clips import frames as real_frames

weights, threshold = sys.argv[1], float(sys.argv[2])
frames = np.array(real_frames("pstudio.mp4", 4, 3))
masks = get_backend("masks", "grounded_sam", weights_dir=weights, sam2_checkpoint="sam2.1_hiera_tiny.pt",
                    sam2_config="configs/sam2.1/sam2.1_hiera_t.yaml", box_threshold=threshold, key_frame_idx=0)
t0 = time.monotonic()
masks.load("cpu")
api = masks._api
# GroundingDINO's own outputs, converted here from normalised (cx, cy, w, h) to pixels at the frame's size.
image_boxes = masks._boxes(frames[0], "red t-shaped block.")
from PIL import Image
inputs = api["processor"](images=Image.fromarray(frames[0]), text="red t-shaped block.", return_tensors="pt")
with torch.no_grad():
    out = api["model"](**inputs)
scores = torch.sigmoid(out.logits[0]).max(-1).values
cx, cy, w, h = out.pred_boxes[0].unbind(-1)
expected = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1) * torch.tensor([512, 384, 512, 384])
expected = expected[scores > threshold]
state = masks.init_state(frames)
result = masks.segment(frames, "red t-shaped block")
print(json.dumps({
    "boxes": image_boxes.tolist(), "expected": expected.tolist(), "scores": scores.tolist(),
    "images_equal": bool(torch.equal(state["images"].cpu(), torch.from_numpy(sam2_images(frames, 1024)))),
    "images_shape": list(state["images"].shape), "size": [state["video_height"], state["video_width"]],
    "masks": None if result is None else {
        "shape": list(result.shape), "dtype": str(result.dtype), "fraction": float(result.mean())},
    "seconds": time.monotonic() - t0,
}))
"""


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gsam")
    run_python(BUILD, str(folder), path=[source("facebookresearch+sam2")], env={"SAM2_BUILD_CUDA": "0"})
    return folder


def run(weights, threshold: float):
    return run_python(RUN, str(weights), str(threshold), path=[source("facebookresearch+sam2")])


def test_grounded_sam_adapter_on_real_groundingdino_and_sam2(weights):
    res = run(weights, 0.3)  # y2r's box_threshold
    boxes, expected = np.array(res["boxes"]).reshape(-1, 4), np.array(res["expected"]).reshape(-1, 4)
    # The boxes our adapter gets are transformers' conversion of the normalised boxes to the frame's pixels,
    # above the threshold only.
    assert len(boxes) == sum(s > 0.3 for s in res["scores"])
    np.testing.assert_allclose(boxes, expected, atol=1e-3)
    # SAM 2 sees the decoded frames through y2r's resize, bit for bit (no JPEG re-encoding).
    assert res["images_equal"] and res["images_shape"] == [4, 3, 1024, 1024] and res["size"] == [384, 512]
    if len(boxes):
        assert res["masks"]["shape"] == [4, 384, 512] and res["masks"]["dtype"] == "bool"
    else:
        assert res["masks"] is None
    print(f"grounded_sam conformance: {len(boxes)} boxes, {res['seconds']:.1f} s")


def test_nothing_above_the_threshold_gives_no_mask(weights):
    res = run(weights, 1.0)  # a sigmoid never exceeds 1
    assert res["boxes"] == [] and res["masks"] is None

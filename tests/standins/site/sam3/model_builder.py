"""Stand-in for SAM 3's ``build_sam3_video_predictor``: the request API of its video predictor, CUDA-only like it.

Like upstream (facebookresearch/sam3 at 99d02f28):

- ``build_sam3_video_predictor(*args, gpus_to_use=None, **kwargs)`` builds the multi-GPU predictor
  (model_builder.py:794-797), which asks torch for the current CUDA device when no GPU is named and
  checks the named ones against ``torch.cuda.device_count()`` (sam3_video_predictor.py:293-313), so
  it fails on a machine without CUDA — unless FRAMEFLEET_STANDIN_SAM3_CPU=1, which the stand-ins'
  venv sets so that the chain tests can run it on this CPU.
- Without ``checkpoint_path`` the model is downloaded from the Hugging Face hub (model_builder.py:
  774-775): the stand-in raises instead. The checkpoint is read with ``torch.load(...,
  weights_only=True)``, its ``"model"`` entry if it has one, and loaded strictly (lines 777-784).
  The tokenizer gzip-reads ``bpe_path``, by default ``assets/bpe_simple_vocab_16e6.txt.gz`` in the
  package (lines 674-677; tokenizer_ve.py:140-142).
- ``start_session`` reads a folder of ``<index>.<ext>`` images, in index order (io_utils.py:157-185);
  ``add_prompt`` starts the session over (a text prompt applies to every frame) and answers for
  the prompted frame only (sam3_video_inference.py:840-907); ``propagate_in_video`` refuses a
  session without a prompt (lines 222-231) and yields every frame from the earliest prompted one
  forward, then backward from the one before it (sam3_video_predictor.py:184-221); the outputs
  hold ``out_obj_ids``, ``out_probs``, ``out_boxes_xywh`` (normalised) and ``out_binary_masks``
  (N, H, W) bool at the video's size, objects of empty mask left out (sam3_video_inference.py:430-521);
  ``close_session`` may be called twice (lines 237-252).

The "model" finds one object (id 0) when the text names a "block": on every frame, its bright pixels
(mean RGB above the checkpoint's ``detector.brightness``).
"""

from __future__ import annotations

import gzip
import os
import uuid
from pathlib import Path

import numpy as np
import torch
from PIL import Image

IMAGE_EXTS = [".jpg", ".jpeg", ".png", ".bmp", ".tiff", ".webp"]


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.detector = torch.nn.Module()
        self.detector.register_buffer("brightness", torch.tensor(0.0))


class Sam3VideoPredictor:
    _ALL_INFERENCE_STATES: dict = {}

    def __init__(self, checkpoint_path=None, bpe_path=None, **_: object) -> None:
        if bpe_path is None:
            bpe_path = str(Path(__file__).parent / "assets" / "bpe_simple_vocab_16e6.txt.gz")
        with open(bpe_path, "rb") as fh:
            self.merges = gzip.decompress(fh.read()).decode("utf-8").split("\n")[1:]
        if checkpoint_path is None:
            raise OSError("facebook/sam3 sam3.pt is not in the Hugging Face cache, and the hub is offline")
        with open(checkpoint_path, "rb") as f:
            ckpt = torch.load(f, map_location="cpu", weights_only=True)
        if "model" in ckpt and isinstance(ckpt["model"], dict):
            ckpt = ckpt["model"]
        self.model = _Model()
        self.model.load_state_dict(ckpt, strict=True)
        self.model.eval()

    def handle_request(self, request):
        kind = request["type"]
        if kind == "start_session":
            return self.start_session(request["resource_path"], request.get("session_id"))
        if kind == "add_prompt":
            return self.add_prompt(request["session_id"], request["frame_index"], text=request.get("text"))
        if kind == "reset_session":
            self._get_session(request["session_id"])["prompt"] = None
            return {"is_success": True}
        if kind == "close_session":
            self._ALL_INFERENCE_STATES.pop(request["session_id"], None)
            return {"is_success": True}
        raise RuntimeError(f"invalid request type: {kind}")

    def handle_stream_request(self, request):
        if request["type"] != "propagate_in_video":
            raise RuntimeError(f"invalid request type: {request['type']}")
        direction = request.get("propagation_direction", "both")
        if direction not in ["both", "forward", "backward"]:
            raise ValueError(f"invalid propagation direction: {direction}")
        state = self._get_session(request["session_id"])
        if state["prompt"] is None:
            raise RuntimeError(
                "No prompts are received on any frames. Please add prompt on at least one frame before propagation."
            )
        start = state["prompt"][0]
        order = []
        if direction in ["both", "forward"]:
            order += list(range(start, state["num_frames"]))
        if direction in ["both", "backward"]:
            order += list(range(start - 1, -1, -1))
        for t in order:
            yield {"frame_index": t, "outputs": self._outputs(state, t)}

    def start_session(self, resource_path, session_id=None):
        names = [p for p in os.listdir(resource_path) if os.path.splitext(p)[-1].lower() in IMAGE_EXTS]
        names.sort(key=lambda p: int(os.path.splitext(p)[0]))
        if not names:
            raise RuntimeError(f"no images found in {resource_path}")
        frames = np.stack([np.asarray(Image.open(os.path.join(resource_path, n)).convert("RGB")) for n in names])
        session_id = session_id or str(uuid.uuid4())
        self._ALL_INFERENCE_STATES[session_id] = {"frames": frames, "num_frames": len(frames), "prompt": None}
        return {"session_id": session_id}

    def add_prompt(self, session_id, frame_idx, text=None):
        state = self._get_session(session_id)
        assert text is not None, "at least one type of prompt (text, boxes) must be provided"
        assert 0 <= frame_idx < state["num_frames"], f"{frame_idx=} is out of range"
        state["prompt"] = (frame_idx, text)  # a text prompt starts the session over
        return {"frame_index": frame_idx, "outputs": self._outputs(state, frame_idx)}

    def _outputs(self, state, t):
        frame = state["frames"][t]
        H, W = frame.shape[:2]
        bright = frame.mean(axis=-1) > float(self.model.detector.brightness)
        found = "block" in state["prompt"][1] and bool(bright.any())
        masks = bright[None] if found else np.zeros((0, H, W), bool)
        boxes = np.zeros((len(masks), 4), np.float32)
        if found:
            ys, xs = np.nonzero(bright)
            boxes[0] = [xs.min() / W, ys.min() / H, (xs.max() + 1 - xs.min()) / W, (ys.max() + 1 - ys.min()) / H]
        return {
            "out_obj_ids": np.arange(len(masks), dtype=np.int64),
            "out_probs": np.full(len(masks), 0.9, np.float32),
            "out_boxes_xywh": boxes,
            "out_binary_masks": masks,
        }

    def _get_session(self, session_id):
        session = self._ALL_INFERENCE_STATES.get(session_id)
        if session is None:
            raise RuntimeError(f"Cannot find session {session_id}; it might have expired")
        return session


class Sam3VideoPredictorMultiGPU(Sam3VideoPredictor):
    def __init__(self, *model_args, gpus_to_use=None, **model_kwargs) -> None:
        if os.environ.get("FRAMEFLEET_STANDIN_SAM3_CPU") != "1":
            if gpus_to_use is None:
                gpus_to_use = [torch.cuda.current_device()]
            assert all(0 <= i < torch.cuda.device_count() for i in gpus_to_use)
            torch.cuda.set_device(torch.device(f"cuda:{gpus_to_use[0]}"))
        super().__init__(*model_args, **model_kwargs)


def build_sam3_video_predictor(*model_args, gpus_to_use=None, **model_kwargs):
    return Sam3VideoPredictorMultiGPU(*model_args, gpus_to_use=gpus_to_use, **model_kwargs)

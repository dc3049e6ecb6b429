"""The ``sam3`` masks backend: SAM 3 finds the prompted objects from the text alone and follows them (y2r's default).

It follows y2r's ``sam3`` path (hgupt3/y2r ``dataset_scripts/config.yaml:33``, ``detection_model:
"sam3"``): process_gsam.py:92-95 builds ``build_sam3_video_predictor()`` once per worker, and
``thirdparty/sam2/grounded_sam2.py`` (``sam3_video``, lines 380-646) runs one session per video
through the predictor's request API: ``start_session`` on the folder of PNG frames, ``add_prompt``
with the text on the key frame (the middle frame when that finds nothing, lines 476-510),
``propagate_in_video`` both ways, then each object's masks per frame (lines 520-571), and
``close_session`` in any case. process_gsam.py:134-145 calls it again from the middle frame when
the first call gave nothing, and process_tapip3d.py:426-428 merges the objects into one mask. When
nothing is found y2r saves no mask: ``segment`` returns None and the tracks stage queries a grid.

Differences from y2r, none in what the model computes: the checkpoint is read from
``weights_dir`` instead of being downloaded from the Hugging Face hub (model_builder.py:644-650
fetches ``facebook/sam3``'s ``sam3.pt``), and the predictor runs on this worker's GPU.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tasks.backends.base import MasksBackend, Progress, check_params
from tasks.backends.grounded_sam import key_frame
from tasks.backends.upstream import inside_folder, need_dir, need_file, need_module, no_downloads
from tasks.errors import ModelLoadError

log = logging.getLogger(__name__)
INSTALL = "bash deploy/envs/build.sh sam3  (SAM 3: pip install git+https://github.com/facebookresearch/sam3)"
FETCH = (
    "Fetch it once with network access (accept SAM 3's licence at https://huggingface.co/facebook/sam3 first): "
    "huggingface-cli download facebook/sam3 sam3.pt --local-dir {weights}"
)
# sam3/model_builder.py:585-588: the tokenizer's vocabulary ships inside the sam3 package.
BPE_FILE = Path("assets") / "bpe_simple_vocab_16e6.txt.gz"


def sam3_prompt(text: str) -> str:
    """Return ``text`` without trailing periods, as y2r gives it to SAM 3 (grounded_sam2.py:423-424)."""
    return text.rstrip(".")


def write_png_frames(frames: np.ndarray, folder: Path) -> None:
    """Write ``frames`` (T, H, W, 3) RGB as ``00000.png``..., the folder y2r gives SAM 3 (preprocess.py:117-119)."""
    from PIL import Image

    for i, frame in enumerate(frames):
        Image.fromarray(np.ascontiguousarray(frame)).save(folder / f"{i:05d}.png", compress_level=1)


def union_of_objects(outputs_per_frame: dict[int, dict[str, Any]], shape: tuple[int, int, int]) -> np.ndarray | None:
    """Return (T, H, W) bool, the union of every object's mask per frame, or None when no frame holds an object.

    ``outputs_per_frame`` maps a frame to SAM 3's outputs (``out_obj_ids`` (N,), ``out_binary_masks``
    (N, h, w)); masks of another size are resized to (H, W) by nearest neighbour, as y2r does
    (grounded_sam2.py:533-571).
    """
    import cv2

    T, H, W = shape
    if not any(len(out.get("out_obj_ids", ())) for out in outputs_per_frame.values()):
        return None
    union = np.zeros((T, H, W), dtype=bool)
    for t, out in outputs_per_frame.items():
        masks = np.asarray(out.get("out_binary_masks", np.zeros((0, H, W), bool)))
        for mask in masks[: len(out.get("out_obj_ids", ()))]:
            if mask.shape != (H, W):
                mask = cv2.resize(mask.astype(np.uint8), (W, H), interpolation=cv2.INTER_NEAREST)
            union[t] |= mask.astype(bool)
    return union


def gpu_index(device: str, torch: Any) -> list[int] | None:
    """Return the predictor's ``gpus_to_use`` for ``device`` ("cuda:1" -> [1], "cuda" -> the current one), or None."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return [dev.index if dev.index is not None else torch.cuda.current_device()]


class Sam3Masks(MasksBackend):
    """Object masks (T, H, W) bool of the objects a text prompt names; None when nothing is found (y2r saves no mask).

    ``weights_dir`` holds ``checkpoint`` (SAM 3's ``sam3.pt``); ``bpe_path`` is the tokenizer's
    vocabulary (default: the one the sam3 package ships); ``key_frame_idx`` is the frame SAM 3
    detects on first (-1: the middle frame). SAM 3's video predictor runs on CUDA only.
    """

    local_params = ("weights_dir",)

    name = "sam3"

    def __init__(
        self,
        weights_dir: str | None = None,
        checkpoint: str = "sam3.pt",
        bpe_path: str | None = None,
        key_frame_idx: int = 0,
        **unknown: Any,
    ) -> None:
        check_params(type(self), unknown, "weights_dir, checkpoint, bpe_path, key_frame_idx")
        super().__init__()
        self.weights_dir = weights_dir
        self.checkpoint = checkpoint
        self.bpe_path = bpe_path
        self.key_frame_idx = int(key_frame_idx)
        self._predictor: Any = None

    def load(self, device: str) -> None:
        """Check the checkpoint and vocabulary, import SAM 3 and build its video predictor on ``device`` (a GPU)."""
        weights = need_dir(
            self.weights_dir, "SAM 3's folder", "stages.masks.params.weights_dir", FETCH.format(weights="<weights_dir>")
        )
        ckpt = need_file(
            inside_folder(weights, self.checkpoint, "stages.masks.params.checkpoint"),
            "the SAM 3 checkpoint",
            FETCH.format(weights=weights),
        )
        builder = need_module("sam3.model_builder", "SAM 3", INSTALL)
        import sam3  # type: ignore[import-not-found]
        import torch

        bpe = Path(self.bpe_path) if self.bpe_path else Path(sam3.__file__).parent / BPE_FILE
        need_file(bpe, "SAM 3's tokenizer vocabulary", f"It ships with the sam3 package: {INSTALL}")
        gpus = gpu_index(device, torch)
        try:
            with no_downloads():
                predictor = builder.build_sam3_video_predictor(
                    checkpoint_path=str(ckpt), bpe_path=str(bpe), gpus_to_use=gpus
                )
        except (AssertionError, RuntimeError) as exc:
            if gpus is not None:
                raise
            # sam3_video_predictor.py:52 and 293-313: the model, the frames and the tracker's state live on CUDA.
            raise ModelLoadError(
                f"SAM 3's video predictor runs on CUDA only, and this worker's device is {device!r} ({exc}). "
                "Run the masks stage on a GPU worker, or choose another masks backend (stages.masks.backend)."
            ) from exc
        self._predictor = predictor
        super().load(device)

    def segment(self, frames: np.ndarray, prompt: str, progress: Progress | None = None) -> np.ndarray | None:
        """Return (T, H, W) bool: the union of the objects ``prompt`` names in ``frames`` (T, H, W, 3); None if none."""
        if self._predictor is None:
            raise RuntimeError("Sam3Masks.segment called before load(device)")
        T = len(frames)
        text = sam3_prompt(prompt)
        with tempfile.TemporaryDirectory(prefix="framefleet-sam3-") as folder:
            write_png_frames(frames, Path(folder))
            masks, tried_middle = self._sam3_video(folder, frames.shape[:3], text, key_frame(T, self.key_frame_idx))
            # process_gsam.py:134-145: once more from the middle frame, unless that call already started there
            # (the same requests on the same frames: the same answer).
            if masks is None and self.key_frame_idx != -1 and not tried_middle:
                masks, _ = self._sam3_video(folder, frames.shape[:3], text, key_frame(T, -1))
        if masks is None:
            log.warning(
                "SAM 3 found no %r (key frame %d, then the middle one); no mask (as y2r)", text, self.key_frame_idx
            )
            return None
        if progress is not None:
            progress(T, T)
        return masks

    def _sam3_video(
        self, folder: str, shape: tuple[int, int, int], text: str, start: int
    ) -> tuple[np.ndarray | None, bool]:
        """One session as y2r's ``sam3_video``: the union mask or None, and whether the middle frame was prompted."""
        predictor, T = self._predictor, shape[0]
        if not 0 <= start < T:
            # grounded_sam2.py:455-458: a key frame past the video finds nothing (the caller then tries the middle).
            log.warning("key frame %d is outside the video's frames 0-%d", start, T - 1)
            return None, False
        session = predictor.handle_request({"type": "start_session", "resource_path": folder})["session_id"]
        try:
            found = self._detect(session, start, text)
            tried_middle = start == T // 2
            if not found and start != T // 2:
                # grounded_sam2.py:489-510: reset, then prompt the middle frame.
                predictor.handle_request({"type": "reset_session", "session_id": session})
                found, tried_middle = self._detect(session, T // 2, text), True
            if not found:
                return None, tried_middle
            outputs: dict[int, dict[str, Any]] = {}
            request = {"type": "propagate_in_video", "session_id": session, "propagation_direction": "both"}
            for response in predictor.handle_stream_request(request):
                outputs[int(response["frame_index"])] = response["outputs"]
            return union_of_objects(outputs, shape), tried_middle
        finally:
            predictor.handle_request({"type": "close_session", "session_id": session})

    def _detect(self, session: str, frame: int, text: str) -> bool:
        """Prompt ``text`` on ``frame``; return whether SAM 3 found any object there (grounded_sam2.py:476-487)."""
        request = {"type": "add_prompt", "session_id": session, "frame_index": frame, "text": text}
        outputs = self._predictor.handle_request(request).get("outputs", {})
        return len(outputs.get("out_obj_ids", ())) > 0

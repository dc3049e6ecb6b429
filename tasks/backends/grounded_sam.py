"""The ``grounded_sam`` masks backend: GroundingDINO (transformers) finds the prompted object, SAM 2 follows it.

It follows y2r's ``grounding-dino`` path: hgupt3/y2r ``dataset_scripts/process_gsam.py:56-72``
loads ``IDEA-Research/grounding-dino-base`` and SAM 2.1 hiera-large once;
``thirdparty/sam2/grounded_sam2.py`` (``gsam_video``) detects boxes on a key frame
(lines 114-150), prompts SAM 2's video predictor with each box and propagates forward, then
backward from the key frame (lines 210-260). process_gsam.py:135-139 retries on the middle
frame when the first finds nothing; process_tapip3d.py:426-428 merges the objects into one mask.
When neither finds anything y2r saves no mask (grounded_sam2.py:146-148 returns None), and its
tracks step then queries a grid (process_tapip3d.py:462-482): ``segment`` returns None.

SAM 2 sees the frames y2r's vendored sam2 gives it: the decoded frames, losslessly, resized to
the model's square with OpenCV's bilinear filter (y2r ``thirdparty/sam2/utils/misc.py:218-232``),
normalised by ImageNet's mean and std (misc.py:314-318); upstream sam2 would resize with PIL.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tasks.backends.base import MasksBackend, Progress, check_params
from tasks.backends.upstream import inside_folder, need_dir, need_file, need_module, no_downloads

log = logging.getLogger(__name__)
INSTALL = "bash deploy/envs/build.sh grounded_sam  (transformers and SAM 2: pip install git+https://github.com/facebookresearch/sam2)"
FETCH = (
    "Fetch them once with network access: huggingface-cli download IDEA-Research/grounding-dino-base "
    "--local-dir {weights}/grounding-dino-base; wget "
    "https://dl.fbaipublicfiles.com/segment_anything_2/092824/sam2.1_hiera_large.pt -P {weights}"
)


def detector_prompt(text: str) -> str:
    """Return ``text`` ending in a period, as GroundingDINO expects (y2r appends one, process_gsam.py:113)."""
    text = text.strip()
    return text if text.endswith(".") else text + "."


def key_frame(num_frames: int, key_frame_idx: int) -> int:
    """Return the frame to detect on: ``key_frame_idx``, or the middle frame T // 2 for -1 (grounded_sam2.py:92-95)."""
    return num_frames // 2 if key_frame_idx == -1 else key_frame_idx


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def sam2_images(frames: np.ndarray, image_size: int) -> np.ndarray:
    """Return (T, 3, S, S) float32: RGB ``frames`` (T, H, W, 3) uint8 as y2r's sam2 loads them for its model.

    OpenCV's bilinear resize to ``image_size`` square, then /255 and ImageNet's mean and std
    (y2r ``thirdparty/sam2/utils/misc.py:218-232`` and 314-318).
    """
    import cv2

    out = np.empty((len(frames), 3, image_size, image_size), np.float32)
    mean = np.asarray(IMAGENET_MEAN, np.float32)[:, None, None]
    std = np.asarray(IMAGENET_STD, np.float32)[:, None, None]
    for i, frame in enumerate(frames):
        img = np.ascontiguousarray(frame)
        if img.shape[:2] != (image_size, image_size):
            img = cv2.resize(img, (image_size, image_size), interpolation=cv2.INTER_LINEAR)
        out[i] = (img.astype(np.float32).transpose(2, 0, 1) / 255.0 - mean) / std
    return out


def strongest(boxes: np.ndarray, scores: np.ndarray, max_objects: int | None) -> np.ndarray:
    """Return the ``max_objects`` highest-scoring of ``boxes`` (N, 4), best first; all of them, in order, for None."""
    if max_objects is None or len(boxes) <= max_objects:
        return boxes
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:max_objects]
    return boxes[order]


def write_lossless_frames(frames: np.ndarray, folder: Path) -> None:
    """Write ``frames`` (T, H, W, 3) as ``00000.jpg``... holding PNG data (SAM 2 wants the name; PIL reads the data)."""
    from PIL import Image

    for i, frame in enumerate(frames):
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(frame)).save(buf, format="PNG", compress_level=1)
        (folder / f"{i:05d}.jpg").write_bytes(buf.getvalue())


class GroundedSamMasks(MasksBackend):
    """Object masks (T, H, W) bool of the object a text prompt names; None when nothing is found (y2r saves no mask).

    ``weights_dir`` holds ``grounding-dino-base/`` (a Hugging Face snapshot) and
    ``sam2_checkpoint``; ``box_threshold`` is GroundingDINO's score threshold (0-1);
    ``max_objects``: SAM 2 follows at most this many boxes, the highest-scoring (default: every box
    above the threshold, as y2r). SAM 2's time grows with the objects it follows: a detector that
    fires on hundreds of boxes (an untrained one does) costs seconds per frame.
    """

    local_params = ("weights_dir",)

    name = "grounded_sam"

    def __init__(
        self,
        weights_dir: str | None = None,
        detector: str = "grounding-dino-base",
        sam2_checkpoint: str = "sam2.1_hiera_large.pt",
        sam2_config: str = "configs/sam2.1/sam2.1_hiera_l.yaml",
        box_threshold: float = 0.3,
        key_frame_idx: int = 0,
        max_objects: int | None = None,
        **unknown: Any,
    ) -> None:
        check_params(
            type(self),
            unknown,
            "weights_dir, detector, sam2_checkpoint, sam2_config, box_threshold, key_frame_idx, max_objects",
        )
        if max_objects is not None and int(max_objects) < 1:
            raise ValueError(f"max_objects must be >= 1 (or unset: every box), got {max_objects}")
        super().__init__()
        self.weights_dir = weights_dir
        self.detector = detector
        self.sam2_checkpoint = sam2_checkpoint
        self.sam2_config = sam2_config
        self.box_threshold = float(box_threshold)
        self.key_frame_idx = int(key_frame_idx)
        self.max_objects = None if max_objects is None else int(max_objects)
        self._api: dict[str, Any] = {}

    def load(self, device: str) -> None:
        """Check the weights, import transformers and SAM 2, and load both models on ``device``."""
        weights = need_dir(
            self.weights_dir,
            "the masks models' folder",
            "stages.masks.params.weights_dir",
            FETCH.format(weights="<weights_dir>"),
        )
        fetch = FETCH.format(weights=weights)
        detector_dir = need_dir(
            inside_folder(weights, self.detector, "stages.masks.params.detector"),
            "the GroundingDINO snapshot",
            "stages.masks.params.detector",
            fetch,
        )
        sam_ckpt = need_file(
            inside_folder(weights, self.sam2_checkpoint, "stages.masks.params.sam2_checkpoint"),
            "the SAM 2 checkpoint",
            fetch,
        )
        # A name among the sam2 package's own configs (hydra composes it and builds the classes it names).
        inside_folder(
            Path("configs"), self.sam2_config, "stages.masks.params.sam2_config", "the sam2 package's configs"
        )
        transformers = need_module("transformers", "GroundingDINO", INSTALL)
        build_sam = need_module("sam2.build_sam", "SAM 2", INSTALL)
        import torch

        with no_downloads():
            processor = transformers.AutoProcessor.from_pretrained(str(detector_dir))
            model = transformers.AutoModelForZeroShotObjectDetection.from_pretrained(str(detector_dir)).to(device)
            predictor = build_sam.build_sam2_video_predictor(self.sam2_config, str(sam_ckpt), device=device)
        self._api = {"torch": torch, "processor": processor, "model": model, "predictor": predictor}
        super().load(device)

    def segment(self, frames: np.ndarray, prompt: str, progress: Progress | None = None) -> np.ndarray | None:
        """Return (T, H, W) bool: the union of the objects ``prompt`` names in ``frames`` (T, H, W, 3); None if none."""
        if not self._api:
            raise RuntimeError("GroundedSamMasks.segment called before load(device)")
        T, H, W = frames.shape[:3]
        text = detector_prompt(prompt)
        start = key_frame(T, self.key_frame_idx)
        boxes = self._boxes(frames[start], text)
        if len(boxes) == 0 and self.key_frame_idx != -1:
            start = key_frame(T, -1)
            boxes = self._boxes(frames[start], text)
        if len(boxes) == 0:
            log.warning("no %r found on frames %d or %d; no mask (as y2r)", text, self.key_frame_idx, start)
            return None
        masks = self._propagate(frames, boxes, start)
        if progress is not None:
            progress(T, T)
        return masks

    def _boxes(self, frame: np.ndarray, text: str) -> np.ndarray:
        """Return GroundingDINO's boxes (N, 4) xyxy pixels above ``box_threshold`` on one RGB frame (``max_objects``
        of them at most, the best first)."""
        from PIL import Image

        torch, processor = self._api["torch"], self._api["processor"]
        image = Image.fromarray(np.ascontiguousarray(frame))
        inputs = processor(images=image, text=text, return_tensors="pt").to(self.device)
        with torch.no_grad():
            outputs = self._api["model"](**inputs)
        results = processor.post_process_grounded_object_detection(
            outputs, inputs.input_ids, target_sizes=[image.size[::-1]], threshold=self.box_threshold
        )
        boxes = np.asarray(results[0]["boxes"].cpu().numpy(), dtype=np.float32).reshape(-1, 4)
        return strongest(boxes, results[0]["scores"].cpu().numpy().reshape(-1), self.max_objects)

    def init_state(self, frames: np.ndarray) -> dict[str, Any]:
        """Return SAM 2's inference state for ``frames`` (T, H, W, 3), its images as y2r's sam2 makes them."""
        torch, predictor = self._api["torch"], self._api["predictor"]
        with tempfile.TemporaryDirectory(prefix="framefleet-sam2-") as folder:
            # SAM 2's video predictor reads a folder of frames named by index (sam2/utils/misc.py:243-248).
            write_lossless_frames(frames, Path(folder))
            state = predictor.init_state(video_path=folder)
        images = torch.from_numpy(sam2_images(frames, int(predictor.image_size)))
        state["images"] = images.to(state["images"].device)
        return state

    def _propagate(self, frames: np.ndarray, boxes: np.ndarray, start: int) -> np.ndarray:
        """Prompt SAM 2 with ``boxes`` on frame ``start``, propagate both ways; return the union mask (T, H, W)."""
        torch, predictor = self._api["torch"], self._api["predictor"]
        T, H, W = frames.shape[:3]
        union = np.zeros((T, H, W), dtype=bool)
        on_cuda = str(self.device).startswith("cuda")
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else contextlib.nullcontext()
        with autocast:
            state = self.init_state(frames)
            for obj_id, box in enumerate(boxes, start=1):
                predictor.add_new_points_or_box(inference_state=state, frame_idx=start, obj_id=obj_id, box=box)
            directions = [False, True] if start > 0 else [False]
            for reverse in directions:
                for t, obj_ids, logits in predictor.propagate_in_video(state, start_frame_idx=start, reverse=reverse):
                    for j, obj_id in enumerate(obj_ids):
                        if 1 <= obj_id <= len(boxes):
                            union[t] |= (logits[j] > 0.0).cpu().numpy().reshape(H, W)
        return union

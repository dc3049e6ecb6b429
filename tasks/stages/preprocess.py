"""Preprocess: decode with PyAV, resample to the target fps, scale (OpenCV Lanczos) and centre-crop to 512x384 RGB."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import BadInput
from tasks.job import Job
from tasks.outputs import remote
from tasks.outputs.storage import confine
from tasks.stages.base import Outputs, Progress, Stage, report


class PreprocessStage(Stage):
    """Turn ``{"video_path"}`` into ``{"frames" (T, H, W, 3) uint8, "fps", "source_fps", "source_width",
    "source_height"}``; ``fps`` is the rate of the kept frames, min(target_fps, source_fps)."""

    name = "preprocess"
    default_params = {"target_fps": 10.0}
    default_deadline_s = 1800.0

    def __init__(self, target_fps: float = 10.0, width: int = 512, height: int = 384) -> None:
        if target_fps <= 0 or width <= 0 or height <= 0:
            raise ValueError(f"target_fps, width and height must be > 0, got {target_fps}, {width}, {height}")
        self.target_fps = float(target_fps)
        self.width = int(width)
        self.height = int(height)

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        video = confine(Path(job.dataset_root), job.video)
        remote.refresh(video)  # a video of an object-store RAW: fetched to this host's disk (tasks.outputs.remote)
        return {"video_path": str(video)}

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        """Decode ``inputs["video_path"]``; raises BadInput naming the file when no frame decodes."""
        import av  # PyAV pulls in FFmpeg; only the workers that decode pay for it

        path = str(inputs["video_path"])
        try:
            container = av.open(path)
        except FileNotFoundError as exc:
            raise BadInput(f"{path}: no such file ({exc})") from exc
        except (av.FFmpegError, OSError, ValueError) as exc:
            raise BadInput(f"{path}: not a readable video container ({exc})") from exc
        try:
            return self._decode(container, path, progress)
        finally:
            container.close()

    def _decode(self, container: Any, path: str, progress: Progress | None) -> dict[str, Any]:
        import av

        if not container.streams.video:
            raise BadInput(f"{path}: the file has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        if not rate or float(rate) <= 0:
            raise BadInput(f"{path}: the video stream declares no frame rate")
        source_fps = float(rate)
        # y2r's rule: keep a frame whenever the counter reaches the next multiple of the interval.
        interval = source_fps / self.target_fps if source_fps > self.target_fps else 1.0
        expected = _expected_frames(stream, source_fps, interval)

        frames: list[np.ndarray] = []
        size = None
        next_keep = 0.0
        error: Exception | None = None
        try:
            for index, frame in enumerate(container.decode(stream)):
                if index < next_keep:
                    continue
                next_keep += interval
                image = frame.to_ndarray(format="rgb24")
                size = size or (image.shape[1], image.shape[0])
                frames.append(self._resize(image))
                if len(frames) % 10 == 0:
                    report(progress, len(frames), max(expected, len(frames)))
        except (av.FFmpegError, ValueError, EOFError) as exc:
            error = exc  # a truncated file: keep what decoded before the damage
        if not frames:
            detail = f" ({error})" if error else ""
            raise BadInput(f"{path}: no video frame could be decoded{detail}")
        report(progress, len(frames), len(frames))
        assert size is not None
        return {
            "frames": np.stack(frames),
            "fps": min(self.target_fps, source_fps),
            "source_fps": source_fps,
            "source_width": int(size[0]),
            "source_height": int(size[1]),
        }

    def _resize(self, image: np.ndarray) -> np.ndarray:
        """Return ``image`` (h, w, 3) uint8 scaled by max(W/w, H/h) and centre-cropped to (H, W, 3).

        y2r's ``resize_and_minimal_crop`` (hgupt3/y2r dataset_scripts/preprocess.py L29-50):
        ``cv2.resize(frame, (int(w * scale), int(h * scale)), interpolation=cv2.INTER_LANCZOS4)``.
        y2r resizes OpenCV's BGR frames and this the RGB ones: the filter works per channel.
        """
        import cv2  # only the workers that decode pay for OpenCV

        h, w = image.shape[:2]
        scale = max(self.width / w, self.height / h)
        # max() guards against 511.9999 from the float scale on the dimension that set it
        # (y2r's int() would give a 511-pixel frame there).
        new_w = max(self.width, int(w * scale))
        new_h = max(self.height, int(h * scale))
        resized = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LANCZOS4)
        x0, y0 = (new_w - self.width) // 2, (new_h - self.height) // 2
        return np.ascontiguousarray(resized[y0 : y0 + self.height, x0 : x0 + self.width], dtype=np.uint8)


def _expected_frames(stream: Any, source_fps: float, interval: float) -> int:
    """Best guess of the kept frame count, for progress only; 0 when the container does not say."""
    count = int(stream.frames or 0)
    if not count and stream.duration and stream.time_base:
        count = int(float(stream.duration * stream.time_base) * source_fps)
    return math.ceil(count / interval) if count else 0

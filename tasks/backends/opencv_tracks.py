"""The ``opencv`` track backends: pyramidal Lucas-Kanade with a forward-backward check, lifted to 3D with depth.

What it is: a classical optical-flow tracker; each query pixel is followed frame to frame
and dropped for good when its round trip misses by more than ``fb_max_px`` or it leaves
the frame. The 3D backend lifts each tracked pixel with that frame's depth, K and pose into
the window's first camera. What it is not: a learned tracker; it has no notion of
occlusion (a hidden point is lost, not re-found) and its 3D is only as good as the depth.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.backends.base import Track2DBackend, TrackBackend, Tracks2DOutput, check_params
from tasks.backends.point_tracks import lift_tracks, to_gray, track_pixels
from tasks.errors import ModelLoadError


class _LucasKanade:
    packages = ("opencv-python-headless", "opencv-python")  # whose installed version the provenance records

    def _setup(self, fb_max_px: float, unknown: dict[str, Any]) -> None:
        check_params(type(self), unknown, "fb_max_px")
        if fb_max_px <= 0:
            raise ValueError(f"fb_max_px must be > 0 (pixels), got {fb_max_px}")
        self.fb_max_px = float(fb_max_px)

    def _check_cv2(self) -> None:
        try:
            import cv2  # noqa: F401
        except ImportError as exc:
            raise ModelLoadError(
                f"the opencv track backends need OpenCV ({exc}); install it with: pip install -e '.[real]'"
            ) from exc


class OpenCVTracks(_LucasKanade, TrackBackend):
    """3D tracks: Lucas-Kanade pixels lifted with depth, K and pose into the window's first camera."""

    name = "opencv"

    def __init__(self, fb_max_px: float = 1.0, **unknown: Any) -> None:
        super().__init__()
        self._setup(fb_max_px, unknown)

    def load(self, device: str) -> None:
        self._check_cv2()
        super().load(device)

    def track(
        self,
        frames: np.ndarray,
        queries: np.ndarray,
        depths: np.ndarray,
        intrinsics: np.ndarray,
        extrinsics: np.ndarray,
        query_pixels: np.ndarray | None = None,
        masks: np.ndarray | None = None,
    ) -> np.ndarray:
        """Return (L, N, 3) float32 metres in the window's first camera; NaN from the step a point is lost."""
        if query_pixels is None:
            # Project the 3D queries back to pixels with frame 0's K.
            h = np.asarray(queries, np.float64) @ np.asarray(intrinsics[0], np.float64).T
            query_pixels = h[:, :2] / h[:, 2:3]
        px, _ = track_pixels(to_gray(frames), np.asarray(query_pixels, np.float32), self.fb_max_px)
        out = lift_tracks(px, depths, np.asarray(intrinsics, np.float64), np.asarray(extrinsics, np.float64))
        out[0] = queries  # step 0 is the query itself, exactly
        return out


class OpenCVTracks2D(_LucasKanade, Track2DBackend):
    """2D tracks: Lucas-Kanade pixels and their visibility, like CoTracker's output."""

    name = "opencv"

    def __init__(self, fb_max_px: float = 1.0, **unknown: Any) -> None:
        super().__init__()
        self._setup(fb_max_px, unknown)

    def load(self, device: str) -> None:
        self._check_cv2()
        super().load(device)

    def track2d(self, frames: np.ndarray, query_pixels: np.ndarray, masks: np.ndarray | None = None) -> Tracks2DOutput:
        """Return ``tracks`` (L, N, 2) pixels (NaN once lost) and ``visible`` (L, N) for query pixels (N, 2)."""
        tracks, visible = track_pixels(to_gray(frames), np.asarray(query_pixels, np.float32), self.fb_max_px)
        return {"tracks": tracks, "visible": visible}

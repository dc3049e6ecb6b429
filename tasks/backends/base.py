"""What a model backend is: a class loaded once on a device, called per video, with one typed call per stage kind.

A backend imports its heavy packages (torch, the upstream model, MediaPipe, OpenCV) in
``load`` only, so that settings can be validated and ``tasks`` imported without them. Every
backend has the two knobs the OOM policy reads: ``peak_memory_bytes`` (what its last call
held on the device at its peak) and ``chunk_scale`` (the fraction of its activation memory
it may use; halved after an out-of-memory retry). Backends that have no device memory
leave both at their defaults.

Arrays in and out use the units of docs/contracts.md: metres, pixels at the frame resolution
(512x384 after preprocess), OpenCV camera axes (x right, y down, z forward).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NotRequired, TypedDict

import numpy as np

Progress = Callable[[int, int], None]


class Backend:
    """The base of every model backend: ``load(device)`` once, then the stage's typed call per video.

    ``stage`` names the stage kind the backend serves ("depth", "tracks", "hands", "masks",
    "tracks2d"); ``name`` is what the settings' ``stages.<stage>.backend`` selects.
    Constructor keyword arguments are the backend's parameters (``stages.<stage>.params``
    that the stage itself does not take); an unknown one must raise TypeError naming the
    known ones.
    """

    stage: ClassVar[str] = ""
    name: ClassVar[str] = ""
    # Parameters that do not change what the backend writes (paths on the worker's own host, batch sizes,
    # the stand-ins' memory and pacing knobs): a run's worker may have others (tasks.pipeline.same_settings).
    local_params: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.peak_memory_bytes: int = 0
        self.chunk_scale: float = 1.0
        self.device: str | None = None

    def load(self, device: str) -> None:
        """Load weights on ``device`` ("cpu", "cuda:0"); raise ModelLoadError naming what is missing and the fix."""
        self.device = device


class DepthOutput(TypedDict):
    """What a depth/camera backend returns for one video of T frames of H x W pixels."""

    depths: np.ndarray  # (T, H, W) float32, metric metres; 0 or NaN where unknown
    intrinsics: np.ndarray  # (4,) float [fx, fy, cx, cy] in pixels at H x W (one per video), or (T, 4)
    cam_to_world: np.ndarray  # (T, 4, 4) float64 camera->world (the stage inverts it to world->camera)
    notes: NotRequired[dict[str, Any]]  # JSON-able facts for the run summary (e.g. a fallback and its reason)


class DepthBackend(Backend):
    """Metric depth, intrinsics and camera poses (ViPE's role)."""

    stage = "depth"

    def infer(self, frames: np.ndarray, progress: Progress | None = None) -> DepthOutput:
        """Return the depth and cameras of ``frames`` (T, H, W, 3) uint8 RGB."""
        raise NotImplementedError


class TrackBackend(Backend):
    """3D point tracks over one window (TAPIP3D's role)."""

    stage = "tracks"

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
        """Return positions (L, N, 3) float32, metres, in the camera frame of the window's first frame.

        ``frames`` (L, H, W, 3) uint8; ``queries`` (N, 3) the query points in that same camera
        frame at step 0; ``depths`` (L, H, W) metres; ``intrinsics`` (L, 3, 3); ``extrinsics``
        (L, 4, 4) world->camera; ``query_pixels`` (N, 2) the queries' (u, v) pixels at step 0;
        ``masks`` (L, H, W) bool object masks when a masks stage ran. A point the backend lost
        may be NaN from the step it was lost on.
        """
        raise NotImplementedError


class Tracks2DOutput(TypedDict):
    """What a 2D tracker returns for one window of L frames and N query pixels."""

    tracks: np.ndarray  # (L, N, 2) float32 pixels (u, v) at frame resolution
    visible: np.ndarray  # (L, N) bool


class Track2DBackend(Backend):
    """2D pixel tracks over one window (CoTracker's role, for ``track_type: 2d``)."""

    stage = "tracks2d"

    def track2d(self, frames: np.ndarray, query_pixels: np.ndarray, masks: np.ndarray | None = None) -> Tracks2DOutput:
        """Track ``query_pixels`` (N, 2) of step 0 through ``frames`` (L, H, W, 3) uint8."""
        raise NotImplementedError


class HandDetections(TypedDict):
    """One side's raw detections over T frames; every array is NaN where ``valid`` is False."""

    valid: np.ndarray  # (T,) bool
    wrist_pose: np.ndarray  # (T, 4, 4) float32: rotation = MANO global orient, translation = wrist, camera frame, m
    hand_pose: np.ndarray  # (T, 15, 3, 3) float32 MANO finger rotations (NaN when the model has none)
    joints_3d: np.ndarray  # (T, 21, 3) float32 joints in the camera frame, metres
    betas: np.ndarray  # (T, 10) float32 MANO shape per frame (zeros when the model has none)
    score: NotRequired[np.ndarray]  # (T,) float32 detection confidence in [0, 1], NaN where not detected


class HandsBackend(Backend):
    """Left and right hand poses per frame (WiLoR's role)."""

    stage = "hands"

    def detect(
        self,
        frames: np.ndarray,
        intrinsics: np.ndarray,
        depths: np.ndarray | None = None,
        progress: Progress | None = None,
    ) -> dict[str, HandDetections]:
        """Return ``{"left": ..., "right": ...}`` for ``frames`` (T, H, W, 3) uint8 with K ``intrinsics`` (3, 3).

        ``depths`` (T, H, W) metres is the depth stage's output, for backends that place the
        wrist by back-projecting its pixel (y2r's rule).
        """
        raise NotImplementedError


class MasksBackend(Backend):
    """Object masks per frame from a text prompt (y2r's GroundingDINO + SAM step)."""

    stage = "masks"

    def segment(self, frames: np.ndarray, prompt: str, progress: Progress | None = None) -> np.ndarray | None:
        """Return (T, H, W) bool masks of the object ``prompt`` names in ``frames`` (T, H, W, 3) uint8; None if none."""
        raise NotImplementedError


def check_params(cls: type, unknown: dict[str, Any], known: str) -> None:
    """Raise TypeError for constructor parameters ``cls`` does not take, naming the ``known`` ones."""
    if unknown:
        raise TypeError(f"{cls.__name__} got unknown parameters {sorted(unknown)}; its parameters are {known}")

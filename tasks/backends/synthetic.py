"""Deterministic stand-ins for ViPE, TAPIP3D and WiLoR that follow the real contracts.

Outputs depend on the frames (a result under the wrong video is detectable) and are
geometrically consistent; memory held and compute spent are knobs, so packing and
throughput behave like the real models'.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from tasks.backends.base import DepthBackend, HandsBackend, Track2DBackend, TrackBackend, Tracks2DOutput
from tasks.gpu.fake import FakeGpuSlot, slot_from_env
from tasks.outputs.geometry import axis_angle_to_matrix, content_seed

MIB = 1 << 20
SIDES = ("left", "right")


class SyntheticModel:
    """Memory and compute knobs shared by the synthetic models; torch is imported in ``load`` only.

    ``hold_mib``: memory held on the device from ``load`` on; ``activation_mib``: extra memory
    held during each call; ``matmuls_per_frame``: float32 matmuls of ``matmul_size`` squared
    (default 256) per frame processed; a large size makes a GPU model compute-bound, not launch-bound.
    ``seconds_per_frame``: wall time per frame spent waiting, not computing, as a host waits on its GPU:
    a task of known length that takes no CPU, whatever else the machine runs (the tests' long tasks).
    With ``$FRAMEFLEET_FAKE_GPU`` and ``$FRAMEFLEET_FAKE_GPU_INDEX`` set, both are also allocated on
    that fake GPU (tasks.gpu.fake), which raises its OutOfMemoryError past its scripted threshold.
    """

    # None changes the outputs (a function of the input frames only): a run's worker may have other knobs.
    local_params: ClassVar[tuple[str, ...]] = (
        "hold_mib",
        "activation_mib",
        "matmuls_per_frame",
        "matmul_size",
        "seconds_per_frame",
    )

    def __init__(
        self,
        hold_mib: float = 0,
        activation_mib: float = 0,
        matmuls_per_frame: int = 2,
        matmul_size: int = 256,
        seconds_per_frame: float = 0.0,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unknown parameters {sorted(unknown)}; "
                "its knobs are hold_mib, activation_mib, matmuls_per_frame, matmul_size and seconds_per_frame"
            )
        if matmul_size < 1:
            raise ValueError(f"matmul_size must be >= 1 (the side of the square matrices), got {matmul_size}")
        if hold_mib < 0 or activation_mib < 0 or matmuls_per_frame < 0 or seconds_per_frame < 0:
            raise ValueError(
                f"hold_mib, activation_mib, matmuls_per_frame and seconds_per_frame must be >= 0, "
                f"got {hold_mib}, {activation_mib}, {matmuls_per_frame}, {seconds_per_frame}"
            )
        self.hold_mib = hold_mib
        self.activation_mib = activation_mib
        self.matmuls_per_frame = int(matmuls_per_frame)
        self.matmul_size = int(matmul_size)
        self.seconds_per_frame = float(seconds_per_frame)
        self.device: str | None = None
        self.peak_memory_bytes = 0
        # Fraction of the activation memory used per call; lowered after an out-of-memory retry.
        self.chunk_scale = 1.0
        self._held: Any = None
        self._weights: Any = None
        self._fake: FakeGpuSlot | None = None

    def load(self, device: str) -> None:
        """Allocate the held memory and the weights on ``device`` ("cpu", "cuda:0", ...)."""
        import torch

        dev = torch.device(device)
        if self._fake is None and (slot := slot_from_env()) is not None:
            slot.allocate(self.hold_mib)
            self._fake = slot
        generator = torch.Generator().manual_seed(0)
        n = self.matmul_size
        self._weights = (torch.randn(n, n, generator=generator) / n**0.5).to(dev)
        self._held = torch.ones(int(self.hold_mib * MIB), dtype=torch.uint8, device=dev) if self.hold_mib else None
        self.device = str(dev)

    def _ensure_loaded(self) -> None:
        if self.device is None:
            self.load("cpu")

    @contextlib.contextmanager
    def activations(self) -> Iterator[None]:
        """Hold ``activation_mib`` extra for the duration of one call and record the peak memory."""
        import torch

        self._ensure_loaded()
        on_cuda = self.device is not None and self.device.startswith("cuda")
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        activation_mib = self.activation_mib * self.chunk_scale
        fake = contextlib.nullcontext(None) if self._fake is None else self._fake.held(activation_mib)
        with fake as fake_mib:
            extra = None
            if activation_mib:
                extra = torch.ones(int(activation_mib * MIB), dtype=torch.uint8, device=self.device)
            try:
                yield
            finally:
                if on_cuda:
                    torch.cuda.synchronize(self.device)
                    self.peak_memory_bytes = int(torch.cuda.max_memory_allocated(self.device))
                elif fake_mib is not None:
                    self.peak_memory_bytes = int(fake_mib * MIB)  # this process's MiB on the fake GPU
                del extra

    def spend(self, frames: int) -> None:
        """Do the compute of ``frames`` frames: ``matmuls_per_frame`` square float32 matmuls each, then wait
        ``seconds_per_frame`` each (s)."""
        import torch

        self._ensure_loaded()
        w = self._weights
        # The same product each time into one buffer: a chained product would decay into
        # denormals, which run many times slower on CPUs.
        out = torch.empty_like(w)
        with torch.inference_mode():
            for _ in range(self.matmuls_per_frame * frames):
                torch.mm(w, w, out=out)
        if self.device is not None and self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        if self.seconds_per_frame:
            time.sleep(self.seconds_per_frame * frames)


def _luminance(frames: np.ndarray) -> np.ndarray:
    rgb = frames.astype(np.float32) / 255.0
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


def _box_blur(x: np.ndarray, radius: int, axis: int) -> np.ndarray:
    """Mean over a (2r+1) window along ``axis``, edges replicated."""
    x = np.moveaxis(x, axis, -1)
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(radius + 1, radius)], mode="edge")
    c = np.cumsum(padded, axis=-1, dtype=np.float32)
    out = (c[..., 2 * radius + 1 :] - c[..., : -(2 * radius + 1)]) / np.float32(2 * radius + 1)
    return np.moveaxis(out, -1, axis)


class SyntheticDepth(SyntheticModel, DepthBackend):
    """ViPE's role: metric depth from smoothed luminance (0.4-2.4 m), fx = fy = 0.9 W, a smooth camera path."""

    name = "synthetic"

    def infer(self, frames: np.ndarray, progress: Any = None) -> Any:
        """Return ``depths`` (T, H, W) float32, ``intrinsics`` [fx, fy, cx, cy], ``cam_to_world`` (T, 4, 4)."""
        T, H, W = frames.shape[:3]
        depths = np.empty((T, H, W), dtype=np.float32)
        with self.activations():
            for start in range(0, T, 8):
                chunk = frames[start : start + 8]
                lum = _box_blur(_box_blur(_luminance(chunk), 6, 1), 6, 2)
                depths[start : start + len(chunk)] = 2.4 - 2.0 * lum  # brighter reads as nearer
                self.spend(len(chunk))
                if progress is not None:
                    progress(start + len(chunk), T)
        rng = np.random.default_rng(content_seed(frames[:, ::8, ::8]))
        t = np.arange(T, dtype=np.float64)[:, None] / 10.0
        amp, freq, phase = rng.uniform(0.02, 0.06, 6), rng.uniform(0.5, 1.5, 6), rng.uniform(0, 2 * np.pi, 6)
        wave = amp * np.sin(freq * t + phase)
        pose = np.tile(np.eye(4), (T, 1, 1))
        pose[:, :3, :3] = axis_angle_to_matrix(wave[:, :3])
        pose[:, :3, 3] = wave[:, 3:] + np.array([0.0, 0.0, 0.03]) * t  # a slow dolly forward
        intrinsics = np.array([0.9 * W, 0.9 * W, W / 2.0, H / 2.0], dtype=np.float32)
        return {"depths": depths, "intrinsics": intrinsics, "cam_to_world": pose}


class SyntheticTracker(SyntheticModel, TrackBackend):
    """TAPIP3D's role: scene points drift along a smooth, frame-seeded flow, in the window's first camera."""

    name = "synthetic"

    def track(self, frames: np.ndarray, queries: np.ndarray, *_context: Any, **_named: Any) -> np.ndarray:
        """Return positions (L, N, 3) float32 of query points (N, 3) over a window of frames (L, H, W, 3)."""
        L = frames.shape[0]
        with self.activations():
            self.spend(1)  # one window per start frame: about one frame's worth of work
        rng = np.random.default_rng(content_seed(frames[0, ::8, ::8]))
        k = rng.uniform(2.0, 6.0, 2)
        phase = rng.uniform(0, 2 * np.pi, 2)
        speed = rng.uniform(0.015, 0.03)
        q = np.asarray(queries, dtype=np.float64)
        theta = k[0] * q[:, 0] + k[1] * q[:, 1] + phase[0]
        direction = np.stack([np.cos(theta), np.sin(theta), 0.5 * np.sin(theta + phase[1])], axis=-1)
        curl = np.stack([-np.sin(theta), np.cos(theta), np.zeros_like(theta)], axis=-1)
        t = np.arange(L, dtype=np.float64)[:, None, None]
        return (q[None] + speed * t * direction[None] + 0.002 * t**2 * curl[None]).astype(np.float32)


class SyntheticTracker2D(SyntheticModel, Track2DBackend):
    """CoTracker's role: pixels drift along a smooth, frame-seeded flow; a point leaving the frame is not visible."""

    name = "synthetic"

    def track2d(self, frames: np.ndarray, query_pixels: np.ndarray, masks: Any = None) -> Tracks2DOutput:
        """Return tracks (L, N, 2) and visibility (L, N) of ``query_pixels`` (N, 2) over ``frames`` (L, H, W, 3)."""
        L, H, W = frames.shape[:3]
        with self.activations():
            self.spend(1)
        rng = np.random.default_rng(content_seed(frames[0, ::8, ::8]))
        k, phase, speed = rng.uniform(0.005, 0.02, 2), rng.uniform(0, 2 * np.pi), rng.uniform(1.0, 4.0)
        q = np.asarray(query_pixels, dtype=np.float64)
        theta = k[0] * q[:, 0] + k[1] * q[:, 1] + phase
        direction = np.stack([np.cos(theta), np.sin(theta)], axis=-1)
        t = np.arange(L, dtype=np.float64)[:, None, None]
        uv = q[None] + speed * t * direction[None]
        visible = (uv[..., 0] >= 0) & (uv[..., 0] <= W - 1) & (uv[..., 1] >= 0) & (uv[..., 1] <= H - 1)
        return {"tracks": uv.astype(np.float32), "visible": visible}


def _hand_skeleton() -> np.ndarray:
    """21 joint offsets (m) of a flat right hand in its wrist frame: wrist, then 4 joints per finger."""
    joints = [np.zeros(3)]
    for finger in range(5):
        angle = np.deg2rad(-40 + 20 * finger)
        direction = np.array([np.sin(angle), -np.cos(angle), 0.0])
        base = 0.03 * direction + np.array([0.01 * (finger - 2), 0.0, 0.0])
        joints += [base + 0.025 * j * direction for j in range(4)]
    return np.array(joints)


class SyntheticHands(SyntheticModel, HandsBackend):
    """WiLoR's role: two hands on smooth paths, with dropouts, a long left gap and right-hand outliers."""

    name = "synthetic"

    def detect(self, frames: np.ndarray, intrinsics: np.ndarray, depths: Any = None, progress: Any = None) -> Any:
        """Return raw detections per side: ``valid`` (T,), ``wrist_pose``, ``hand_pose``, ``joints_3d``, ``betas``."""
        T = frames.shape[0]
        with self.activations():
            self.spend(T)
        if progress is not None:
            progress(T, T)
        seed = content_seed(frames[:, ::8, ::8])
        i = np.arange(T)
        t = i[:, None] / 10.0
        out = {}
        for s, side in enumerate(SIDES):
            rng = np.random.default_rng([seed, s])
            sign = -1.0 if side == "left" else 1.0
            ph = rng.uniform(0, 2 * np.pi, 12)
            pos = np.array([sign * 0.12, 0.06, 0.55]) + np.array([0.06, 0.04, 0.08]) * np.sin(
                np.array([0.9, 1.3, 0.7]) * t + ph[:3]
            )
            rotvec = np.array([0.0, sign * 0.5, 0.0]) + np.array([0.4, 0.3, 0.5]) * np.sin(
                np.array([0.5, 0.8, 0.6]) * t + ph[3:6]
            )
            wrist = np.tile(np.eye(4), (T, 1, 1))
            wrist[:, :3, :3] = axis_angle_to_matrix(rotvec)
            wrist[:, :3, 3] = pos
            finger_rv = 0.2 * np.sin(0.9 * t[:, :, None] + ph[6] + np.arange(15)[None, :, None] * [0.3, 0.7, 1.1])
            betas = rng.normal(0.0, 0.5, 10) + 0.01 * np.sin(i[:, None] + np.arange(10))
            skeleton = _hand_skeleton() * np.array([sign, 1.0, 1.0]) * (1.0 + 0.02 * betas[:, :1, None])
            joints = np.einsum("tij,tkj->tki", wrist[:, :3, :3], skeleton) + pos[:, None, :]
            offset = int(rng.integers(0, 13))
            if side == "left":
                gap = 5 + offset
                valid = ~(((i + offset) % 13 == 6) | ((i >= gap) & (i < gap + 22)))
            else:
                valid = (i + offset) % 11 != 4
                outlier = (i + offset) % 17 == 9
                wrist[outlier, 2, 3] += 0.6  # a depth jump the velocity filter must catch
                joints[outlier, :, 2] += 0.6
            out[side] = {
                "valid": valid,
                "wrist_pose": _nan_where(wrist, ~valid),
                "hand_pose": _nan_where(axis_angle_to_matrix(finger_rv), ~valid),
                "joints_3d": _nan_where(joints, ~valid),
                "betas": _nan_where(betas, ~valid),
            }
        return out


def _nan_where(x: np.ndarray, invalid: np.ndarray) -> np.ndarray:
    y = np.array(x, dtype=np.float32, copy=True)
    y[invalid] = np.nan
    return y

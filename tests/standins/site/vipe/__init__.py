"""Stand-in for y2r's ViPE (hgupt3/vipe): ``get_config_path`` and ``make_pipeline`` with ViPE's signatures.

The pipeline returns, per frame, a camera->world pose Rz(0.05 t) with translation
(0.01, -0.02, 0.03) t, a metric depth 0.3 + 2 * luminance + 0.5 * row / H, and pinhole
intrinsics whose vertical field of view is a "GeoCalib" estimate of 50 degrees clamped to
the configured ``fov_min_degrees``/``fov_max_degrees``.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from vipe.streams.base import FrameAttribute

GEOCALIB_FOV_DEGREES = 50.0


def get_config_path() -> Path:
    return Path(__file__).parent / "configs"


class _Pose:
    """The part of lietorch's SE3 that y2r uses: ``matrix()``."""

    def __init__(self, matrix: torch.Tensor) -> None:
        self._matrix = matrix

    def matrix(self) -> torch.Tensor:
        return self._matrix


def camera_to_world(t: int) -> torch.Tensor:
    a = 0.05 * t
    m = torch.eye(4, dtype=torch.float64)
    m[:2, :2] = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
    m[:3, 3] = torch.tensor([0.01 * t, -0.02 * t, 0.03 * t], dtype=torch.float64)
    return m


class _Pipeline:
    def __init__(self, args: Any, model_cache: Any) -> None:
        if model_cache is None:
            raise ValueError("y2r builds the pipeline with a model cache")
        self.args = args
        self.cache = model_cache
        self.return_output_streams = False

    def run(self, video_stream: Any) -> SimpleNamespace:
        fov = GEOCALIB_FOV_DEGREES
        init = self.args.init
        if init.get("fixed_fov_degrees") is not None:
            fov = float(init.fixed_fov_degrees)
        else:
            if init.get("fov_min_degrees") is not None:
                fov = max(fov, float(init.fov_min_degrees))
            if init.get("fov_max_degrees") is not None:
                fov = min(fov, float(init.fov_max_degrees))
        out = []
        for frame in video_stream:
            rgb = frame.rgb
            if rgb.dtype != torch.float32 or float(rgb.max()) > 1.0 or str(rgb.device) != str(self.cache.device):
                raise ValueError(f"frames must be float RGB in [0, 1] on {self.cache.device}")
            H, W = rgb.shape[:2]
            fy = (H / 2.0) / math.tan(math.radians(fov) / 2.0)
            lum = rgb.mean(dim=-1).cpu()
            rows = torch.arange(H, dtype=torch.float32)[:, None].expand(H, W) / H
            out.append(
                SimpleNamespace(
                    pose=_Pose(camera_to_world(frame.raw_frame_idx)),
                    metric_depth=0.3 + 2.0 * lum + 0.5 * rows,
                    intrinsics=torch.tensor([fy, fy, W / 2.0, H / 2.0]),
                )
            )
        if not self.return_output_streams:
            return SimpleNamespace(output_streams=None)
        return SimpleNamespace(output_streams=[_FrameList(out)])


class _FrameList:
    def __init__(self, frames: list[SimpleNamespace]) -> None:
        self.frames = frames

    def get_stream_attribute(self, attribute: FrameAttribute) -> list[Any]:
        return [getattr(f, attribute.value) for f in self.frames]


def make_pipeline(args: Any, model_cache: Any = None) -> _Pipeline:
    return _Pipeline(args, model_cache)

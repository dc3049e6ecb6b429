"""Stand-in for ViPE's ``vipe/streams/base.py``: frame attributes, frames, streams and the cached processed stream."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch.utils.data import IterableDataset


class FrameAttribute(Enum):
    POSE = "pose"
    INTRINSICS = "intrinsics"
    CAMERA_TYPE = "camera_type"
    INSTANCE = "instance"
    MASK = "mask"
    METRIC_DEPTH = "metric_depth"


@dataclass(kw_only=True, slots=True)
class VideoFrame:
    raw_frame_idx: int
    rgb: torch.Tensor
    pose: Any = None
    intrinsics: Any = None
    metric_depth: Any = None


class VideoStream(IterableDataset):
    def frame_size(self) -> tuple[int, int]:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    def fps(self) -> float:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def get_stream_attribute(self, attribute: FrameAttribute) -> list[Any]:
        return [getattr(frame, attribute.value) for frame in self]


class CachedVideoStream(VideoStream):
    def __init__(self, stream: VideoStream) -> None:
        self.frames = list(stream)
        self._fps = stream.fps()
        self._size = stream.frame_size()

    def fps(self) -> float:
        return self._fps

    def frame_size(self) -> tuple[int, int]:
        return self._size

    def __len__(self) -> int:
        return len(self.frames)

    def __iter__(self):
        return iter(self.frames)


class ProcessedVideoStream(VideoStream):
    def __init__(self, stream: VideoStream, processors: list[Any]) -> None:
        self.stream = stream
        self.processors = processors

    def __iter__(self):
        return iter(self.stream)

    def fps(self) -> float:
        return self.stream.fps()

    def frame_size(self) -> tuple[int, int]:
        return self.stream.frame_size()

    def cache(self, desc: str = "", online: bool = False) -> CachedVideoStream:
        return CachedVideoStream(self.stream)

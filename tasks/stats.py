"""Normalization statistics as values that add: per-video partials merged with Chan's formula."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
TRACK_DIMS = {"3d": 3, "2d": 2}


@dataclass(frozen=True)
class Moments:
    """Count, mean and sum of squared deviations (M2) per feature, float64; ``a + b`` pools samples."""

    count: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, dim: int) -> Moments:
        """Return the moments of no samples of ``dim`` features."""
        return cls(0, np.zeros(dim), np.zeros(dim))

    @classmethod
    def from_samples(cls, x: np.ndarray) -> Moments:
        """Return the moments of samples ``x`` (n, d), or (n,) for one feature."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2:
            raise ValueError(f"samples must be (n, d) or (n,), got shape {x.shape}")
        if x.shape[0] == 0:
            return cls.empty(x.shape[1])
        mean = x.mean(axis=0)
        return cls(int(x.shape[0]), mean, ((x - mean) ** 2).sum(axis=0))

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def __add__(self, other: Moments) -> Moments:
        if self.dim != other.dim:
            raise ValueError(f"cannot add moments of {self.dim} and {other.dim} features")
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        n = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / n)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / n)
        return Moments(n, mean, m2)

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation (ddof 0); zeros when there are no samples."""
        if self.count == 0:
            return np.zeros(self.dim)
        return np.sqrt(np.maximum(self.m2, 0.0) / self.count)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": [float(v) for v in self.mean], "m2": [float(v) for v in self.m2]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Moments:
        return cls(int(d["count"]), np.asarray(d["mean"], dtype=np.float64), np.asarray(d["m2"], dtype=np.float64))


_FIELDS = ("displacement", "depth", "pose", "hand_uvd", "hand_rot")


@dataclass(frozen=True)
class VideoStats:
    """The partial statistics of one or more videos of one track type; ``a + b`` pools them."""

    track_type: str
    displacement: Moments
    depth: Moments = field(default_factory=lambda: Moments.empty(1))
    pose: Moments = field(default_factory=lambda: Moments.empty(9))
    hand_uvd: Moments = field(default_factory=lambda: Moments.empty(3))
    hand_rot: Moments = field(default_factory=lambda: Moments.empty(6))

    @classmethod
    def empty(cls, track_type: str = "3d") -> VideoStats:
        """Return the statistics of no videos."""
        if track_type not in TRACK_DIMS:
            raise ValueError(f"track_type must be one of {sorted(TRACK_DIMS)}, got {track_type!r}")
        return cls(track_type, Moments.empty(TRACK_DIMS[track_type]))

    def __add__(self, other: VideoStats) -> VideoStats:
        if self.track_type != other.track_type:
            raise ValueError(f"cannot add {self.track_type} and {other.track_type} statistics")
        return VideoStats(self.track_type, *(getattr(self, f) + getattr(other, f) for f in _FIELDS))

    def to_dict(self) -> dict[str, Any]:
        return {"track_type": self.track_type, **{f: getattr(self, f).to_dict() for f in _FIELDS}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VideoStats:
        return cls(str(d["track_type"]), *(Moments.from_dict(d[f]) for f in _FIELDS))


def _mean_std(m: Moments) -> tuple[list[float], list[float]]:
    if m.count == 0:
        return [0.0] * m.dim, [1.0] * m.dim
    return [float(v) for v in m.mean], [float(v) for v in m.std]


def normalization_stats(total: VideoStats) -> dict[str, Any]:
    """Return the ``normalization_stats.yaml`` mapping of CONTRACTS.md for pooled statistics."""
    disp_mean, disp_std = _mean_std(total.displacement)
    out: dict[str, Any] = {
        "imagenet_mean": list(IMAGENET_MEAN),
        "imagenet_std": list(IMAGENET_STD),
        "track_type": total.track_type,
        "track_dim": TRACK_DIMS[total.track_type],
        "displacement_mean": disp_mean,
        "displacement_std": disp_std,
        "displacement_num_samples": total.displacement.count,
    }
    if total.track_type != "3d":
        return out
    depth_mean, depth_std = _mean_std(total.depth)
    pose_mean, pose_std = _mean_std(total.pose)
    out.update(
        depth_mean=depth_mean[0],
        depth_std=depth_std[0],
        depth_num_samples=total.depth.count,
        pose_mean=pose_mean,
        pose_std=pose_std,
        pose_num_samples=total.pose.count,
    )
    if total.hand_uvd.count > 0:
        uvd_mean, uvd_std = _mean_std(total.hand_uvd)
        rot_mean, rot_std = _mean_std(total.hand_rot)
        out.update(
            hand_uvd_disp_mean=uvd_mean,
            hand_uvd_disp_std=uvd_std,
            hand_rot_disp_mean=rot_mean,
            hand_rot_disp_std=rot_std,
            hand_pose_num_samples=total.hand_uvd.count,
        )
    return out


class _StatsDumper(yaml.SafeDumper):
    """safe_dump's dumper, quoting strings that start with a digit (``track_type: '3d'``, as the contract shows)."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "'" if value[:1].isdigit() else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_StatsDumper.add_representer(str, _represent_str)


def write_stats_yaml(path: str | os.PathLike[str], stats: dict[str, Any]) -> None:
    """Write ``stats`` as sorted block-style YAML atomically, with the mode a plain ``open(path, "w")`` gives.

    y2r writes this file with a plain open (0644 under the usual umask 022) and trainers often
    run as another user than the pipeline, so the temporary file is created with 0666 less the
    umask (``storage.atomic_write``), never mkstemp's 0600.
    """
    from tasks.storage import write_text_atomic

    write_text_atomic(Path(path), yaml.dump(stats, Dumper=_StatsDumper, sort_keys=True, default_flow_style=False))

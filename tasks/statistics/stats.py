"""Normalization statistics as values that add: per-video partials merged with Chan's formula."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
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

    @classmethod
    def pool(cls, counts: np.ndarray, means: np.ndarray, m2s: np.ndarray) -> Moments:
        """Return the moments of k parts at once: ``counts`` (k,), ``means`` and ``m2s`` (k, d).

        The same count, mean and M2 as adding the parts one by one, in a few NumPy passes
        (k groups: M2 = sum M2_i + sum n_i (mean_i - mean)^2); 50,000 videos take milliseconds.
        """
        counts = np.asarray(counts, dtype=np.float64)
        means, m2s = np.asarray(means, dtype=np.float64), np.asarray(m2s, dtype=np.float64)
        n = int(counts.sum())
        if n == 0:
            return cls.empty(means.shape[1])
        mean = (counts[:, None] * means).sum(axis=0) / n
        m2 = m2s.sum(axis=0) + (counts[:, None] * (means - mean) ** 2).sum(axis=0)
        return cls(n, mean, m2)

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

    @classmethod
    def pool(cls, parts: Sequence[Mapping[str, Any]], track_type: str = "3d") -> VideoStats:
        """Pool many videos' partials (``to_dict`` mappings) at once: equal to their sum, without an
        object and an addition per video. Raises ValueError on a partial of another track type."""
        empty = cls.empty(track_type)
        other = next((p["track_type"] for p in parts if p["track_type"] != track_type), None)
        if other is not None:
            raise ValueError(f"cannot add {track_type} and {other} statistics")
        if not parts:
            return empty
        pooled = []
        for f in _FIELDS:
            dim, k = getattr(empty, f).dim, len(parts)
            counts = np.fromiter((p[f]["count"] for p in parts), dtype=np.float64, count=k)
            means = np.array([p[f]["mean"] for p in parts], dtype=np.float64).reshape(k, dim)
            m2s = np.array([p[f]["m2"] for p in parts], dtype=np.float64).reshape(k, dim)
            pooled.append(Moments.pool(counts, means, m2s))
        return cls(track_type, *pooled)


def row_layout(track_type: str) -> list[tuple[str, int]]:
    """(field, features) in the order ``to_row`` writes them; a row holds count, mean and M2 of each."""
    empty = VideoStats.empty(track_type)
    return [(f, getattr(empty, f).dim) for f in _FIELDS]


def to_row(part: Mapping[str, Any], track_type: str) -> np.ndarray:
    """One video's partial (a ``to_dict`` mapping) as a flat float64 row: count, mean, M2 per field.

    Raises ValueError on a partial of another track type (as ``VideoStats.pool``).
    """
    if part["track_type"] != track_type:
        raise ValueError(f"cannot add {track_type} and {part['track_type']} statistics")
    values: list[float] = []
    for f, dim in row_layout(track_type):
        m = part[f]
        if len(m["mean"]) != dim or len(m["m2"]) != dim:
            raise ValueError(f"{f} of a {track_type} partial must have {dim} features, got {len(m['mean'])}")
        values += [m["count"], *m["mean"], *m["m2"]]
    return np.asarray(values, dtype=np.float64)


def pool_rows(rows: np.ndarray, track_type: str) -> VideoStats:
    """Pool k videos' rows (k, width) of ``to_row``: bit for bit what ``VideoStats.pool`` gives for the
    same partials in the same order (the same contiguous arrays go through ``Moments.pool``)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.shape[0] == 0:
        return VideoStats.empty(track_type)
    pooled, at = [], 0
    for _f, dim in row_layout(track_type):
        counts = np.ascontiguousarray(rows[:, at])
        means = np.ascontiguousarray(rows[:, at + 1 : at + 1 + dim])
        m2s = np.ascontiguousarray(rows[:, at + 1 + dim : at + 1 + 2 * dim])
        pooled.append(Moments.pool(counts, means, m2s))
        at += 1 + 2 * dim
    return VideoStats(track_type, *pooled)


def _mean_std(m: Moments) -> tuple[list[float], list[float]]:
    if m.count == 0:
        return [0.0] * m.dim, [1.0] * m.dim
    return [float(v) for v in m.mean], [float(v) for v in m.std]


def normalization_stats(total: VideoStats) -> dict[str, Any]:
    """Return the ``normalization_stats.yaml`` mapping of docs/contracts.md for pooled statistics."""
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


def write_stats_yaml(path: str | os.PathLike[str], stats: dict[str, Any], header: list[str] | None = None) -> None:
    """Write ``stats`` as sorted block-style YAML atomically, with the mode a plain ``open(path, "w")`` gives.

    y2r writes this file with a plain open (0644 under the usual umask 022) and trainers often
    run as another user than the pipeline, so the temporary file is created with 0666 less the
    umask (``storage.atomic_write``), never mkstemp's 0600. ``header``: lines written first as comments.
    """
    from tasks.outputs.storage import write_text_atomic

    comments = "".join(f"# {line}\n" for line in header or [])  # comments: y2r's yaml.safe_load skips them
    body = yaml.dump(stats, Dumper=_StatsDumper, sort_keys=True, default_flow_style=False)
    write_text_atomic(Path(path), comments + body)

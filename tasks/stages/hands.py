"""Hands (WiLoR's role): per-side MANO wrist and finger poses, velocity-filtered and gap-filled."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.errors import BadInput
from tasks.job import Job
from tasks.outputs.geometry import slerp
from tasks.stages.base import Gate, ModelStage, Outputs, Progress, report, require

SIDES = ("left", "right")
_POSE_KEYS = ("wrist_pose", "hand_pose", "joints_3d")


def velocity_filter(valid: np.ndarray, positions: np.ndarray, max_step_m: float) -> np.ndarray:
    """Return ``valid`` without frames whose wrist moved more than ``max_step_m`` x frame gap from the last kept one."""
    kept = np.array(valid, dtype=bool, copy=True)
    last = None
    for i in np.flatnonzero(kept):
        # Compare with the last *kept* frame so one outlier cannot reject the frames after it.
        if last is not None and np.linalg.norm(positions[i] - positions[last]) > max_step_m * (i - last):
            kept[i] = False
            continue
        last = i
    return kept


def fill_gaps(side: dict[str, np.ndarray], max_gap: int) -> None:
    """Fill interior gaps of at most ``max_gap`` frames in place: positions linear, wrist rotation slerp."""
    valid = side["valid"]
    idx = np.flatnonzero(valid)
    for prev, nxt in zip(idx[:-1], idx[1:], strict=True):
        if nxt - prev < 2 or nxt - prev - 1 > max_gap:
            continue
        for j in range(prev + 1, nxt):
            a = (j - prev) / (nxt - prev)
            for key in _POSE_KEYS:  # linear, as y2r does; the wrist rotation is replaced below
                side[key][j] = (1 - a) * side[key][prev] + a * side[key][nxt]
            side["wrist_pose"][j, :3, :3] = slerp(side["wrist_pose"][prev, :3, :3], side["wrist_pose"][nxt, :3, :3], a)
            side["wrist_pose"][j, 3] = (0.0, 0.0, 0.0, 1.0)
            valid[j] = True


class HandsStage(ModelStage):
    """Turn ``{"frames", "intrinsics", "fps"}`` into per side ``{side}_valid`` (T,) bool, ``{side}_wrist_pose``
    (T, 4, 4), ``{side}_hand_pose`` (T, 15, 3, 3), ``{side}_joints_3d`` (T, 21, 3) float32 (NaN where
    invalid), ``{side}_betas`` (10,), and ``intrinsics`` (3, 3).

    ``max_hand_velocity`` is in m/s; ``max_interpolation_gap`` in frames. Its ``quality``: the fraction
    of frames with each hand and with either (after filtering and gap filling), and the mean
    detection score over detected frames where the backend gives one.
    """

    name = "hands"
    cpu_backend = "mediapipe"
    gates = (
        Gate("any_frame_fraction", "min_hand_frame_fraction", "min"),
        Gate("confidence", "min_hand_confidence", "min"),
    )
    reads = ("preprocess", "depth")

    def __init__(
        self,
        backend: str | None = None,
        max_hand_velocity: float = 1.0,
        max_interpolation_gap: int = 20,
        **backend_params: Any,
    ) -> None:
        self.max_hand_velocity = float(max_hand_velocity)
        self.max_interpolation_gap = int(max_interpolation_gap)
        super().__init__(backend, **backend_params)

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        depth = outputs["depth"]
        return {
            "frames": outputs["preprocess"]["frames"],
            "intrinsics": depth["intrinsics"][0],
            "depths": depth["depths"],
            "fps": float(outputs["preprocess"]["fps"]),
        }

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        frames = require(inputs, "frames", self.name, (None, None, None, 3), "u")
        K = require(inputs, "intrinsics", self.name, kind="f")
        if K.shape[-2:] != (3, 3) or K.ndim not in (2, 3) or K.size == 0:
            raise BadInput(f"hands: input 'intrinsics' must have shape (3, 3) or (T, 3, 3), got {K.shape}")
        K = np.asarray(K.reshape(-1, 3, 3)[0], dtype=np.float32)
        fps = float(require(inputs, "fps", self.name, ()))
        T = frames.shape[0]
        depths = inputs.get("depths")
        detections = self.model.detect(
            frames,
            K,
            depths=None if depths is None else np.asarray(depths),
            progress=lambda done, total: report(progress, done, total),
        )
        out: dict[str, Any] = {"intrinsics": K}
        quality: dict[str, Any] = {"frames": T}
        if detections.get("notes"):  # a backend's facts for the run summary, as the depth stage passes them on
            out["notes"] = dict(detections["notes"])
        for name in SIDES:
            side = {key: np.array(detections[name][key], dtype=np.float32) for key in _POSE_KEYS}
            side["valid"] = np.array(detections[name]["valid"], dtype=bool).reshape(T)
            betas = np.asarray(detections[name]["betas"], dtype=np.float32)[side["valid"]]
            if self.max_hand_velocity > 0 and fps > 0:
                kept = velocity_filter(side["valid"], side["wrist_pose"][:, :3, 3], self.max_hand_velocity / fps)
                for key in _POSE_KEYS:
                    side[key][side["valid"] & ~kept] = np.nan
                side["valid"] = kept
            if self.max_interpolation_gap > 0:
                fill_gaps(side, self.max_interpolation_gap)
            out[f"{name}_valid"] = side["valid"]
            quality[f"{name}_frame_fraction"] = round(float(side["valid"].mean()), 4) if T else 0.0
            score = np.asarray(detections[name].get("score", np.full(T, np.nan)), np.float64).reshape(T)
            detected = np.asarray(detections[name]["valid"], dtype=bool).reshape(T) & np.isfinite(score)
            if detected.any():
                quality[f"{name}_confidence"] = round(float(score[detected].mean()), 4)
            for key in _POSE_KEYS:
                out[f"{name}_{key}"] = side[key]
            # Median over the model's detections, as y2r does, before any filtering.
            out[f"{name}_betas"] = (
                np.median(betas, axis=0).astype(np.float32) if len(betas) else np.zeros(10, np.float32)
            )
        either = np.logical_or(out["left_valid"], out["right_valid"]) if T else np.zeros(0, bool)
        quality["any_frame_fraction"] = round(float(either.mean()), 4) if T else 0.0
        scores = [quality[k] for k in ("left_confidence", "right_confidence") if k in quality]
        if scores:
            quality["confidence"] = round(float(np.mean(scores)), 4)
        out["quality"] = quality
        return out

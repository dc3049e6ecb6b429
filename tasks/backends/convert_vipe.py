"""ViPE's settings and outputs, as y2r uses them, turned into framefleet's depth contract (pure functions).

References are to hgupt3/y2r ``dataset_scripts/process_vipe.py`` and hgupt3/vipe (y2r's ViPE,
with the model cache and the field-of-view bounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def vipe_overrides(
    pipeline: str,
    output_dir: str,
    fixed_fov_degrees: float | None,
    fov_min_degrees: float | None,
    fov_max_degrees: float | None,
    optimize_intrinsics: bool,
) -> list[str]:
    """Return the hydra overrides y2r composes ViPE's config with (process_vipe.py:204-227), artifacts off.

    A fixed field of view (degrees) bypasses GeoCalib; otherwise its estimate is clamped to
    ``[fov_min_degrees, fov_max_degrees]``, and the same bounds hold SLAM's refinement.
    """
    overrides = [
        f"pipeline={pipeline}",
        f"pipeline.output.path={output_dir}",
        "pipeline.output.save_artifacts=false",
        "pipeline.output.save_viz=false",
    ]
    if fixed_fov_degrees is not None:
        overrides.append(f"pipeline.init.fixed_fov_degrees={fixed_fov_degrees}")
    else:
        if fov_min_degrees is not None:
            overrides.append(f"pipeline.init.fov_min_degrees={fov_min_degrees}")
        if fov_max_degrees is not None:
            overrides.append(f"pipeline.init.fov_max_degrees={fov_max_degrees}")
    # y2r passes the bounds to SLAM even with a fixed field of view (process_vipe.py:221-224).
    if fov_min_degrees is not None:
        overrides.append(f"+pipeline.slam.fov_min_degrees={fov_min_degrees}")
    if fov_max_degrees is not None:
        overrides.append(f"+pipeline.slam.fov_max_degrees={fov_max_degrees}")
    overrides.append(f"pipeline.slam.optimize_intrinsics={'true' if optimize_intrinsics else 'false'}")
    return overrides


def stack_vipe_outputs(
    poses: Sequence[Any], depths: Sequence[Any], intrinsics: Sequence[Any], frame_shape: tuple[int, int, int]
) -> dict[str, np.ndarray]:
    """Return ``{"cam_to_world" (T, 4, 4) float64, "depths" (T, H, W) float32, "intrinsics" (4,) float64}``.

    ``poses``, ``depths`` and ``intrinsics`` are ViPE's per-frame stream attributes as NumPy
    arrays (None where a frame has none): camera->world 4x4 (OpenCV axes), metric depth (H, W)
    in metres, and ``[fx, fy, cx, cy, *distortion]`` in pixels. As y2r does
    (process_vipe.py:313-323), frames without a pose or depth are skipped and the first
    intrinsics stand for the whole video. ``frame_shape`` is (T, H, W) of the input; a
    different count or size raises ValueError (y2r asserts the same, process_vipe.py:330-333).
    """
    T, H, W = frame_shape
    kept_poses = [np.asarray(p, dtype=np.float64) for p in poses if p is not None]
    kept_depths = [np.asarray(d, dtype=np.float32) for d in depths if d is not None]
    first_k = next((np.asarray(k, dtype=np.float64).reshape(-1) for k in intrinsics if k is not None), None)
    if first_k is None or first_k.size < 4:
        raise ValueError(f"ViPE returned no intrinsics [fx, fy, cx, cy] for any of the {T} frames")
    if len(kept_poses) != T or len(kept_depths) != T:
        raise ValueError(
            f"ViPE returned {len(kept_poses)} poses and {len(kept_depths)} depth maps for {T} frames; "
            "it must return one of each per frame"
        )
    cam_to_world = np.stack(kept_poses)
    stacked = np.stack(kept_depths)
    if cam_to_world.shape[1:] != (4, 4):
        raise ValueError(f"ViPE poses must be 4x4 camera->world matrices, got {cam_to_world.shape[1:]}")
    if stacked.shape[1:] != (H, W):
        raise ValueError(f"ViPE depth maps are {stacked.shape[1:]} but the frames are {(H, W)}")
    return {"cam_to_world": cam_to_world, "depths": stacked, "intrinsics": first_k[:4]}


def world_to_camera(cam_to_world: np.ndarray) -> np.ndarray:
    """Return the world->camera inverse (..., 4, 4) of rigid camera->world poses: ``[R^T, -R^T t]``.

    The closed form of y2r's ``np.linalg.inv(poses)`` (process_vipe.py:138-148) for rigid poses.
    """
    P = np.asarray(cam_to_world, dtype=np.float64)
    R_t = np.swapaxes(P[..., :3, :3], -1, -2)
    out = np.zeros_like(P)
    out[..., :3, :3] = R_t
    out[..., :3, 3] = -np.einsum("...ij,...j->...i", R_t, P[..., :3, 3])
    out[..., 3, 3] = 1.0
    return out

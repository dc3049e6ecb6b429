"""The ``classical`` depth/camera backend: OpenCV two-view geometry between consecutive frames, no learned model.

What it is: intrinsics from a fixed field of view; camera rotation and translation direction
from Lucas-Kanade matches between consecutive frames (a homography when the motion is a
pure rotation, else an essential matrix), chained into poses; sparse points triangulated
from each pair, densified by normalised Gaussian smoothing and scaled so that the median
scene depth is ``median_depth_m``. What it is not: metric (the scale is a prior), dense (the
map between features is interpolated) or bundle-adjusted (errors accumulate along the chain).
When the footage has too little camera motion, it falls back to identity poses and a plane
prior, and says so in ``notes``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.backends import two_view as tv
from tasks.backends.base import DepthBackend, DepthOutput, Progress, check_params
from tasks.backends.point_tracks import lk_step, to_gray
from tasks.errors import ModelLoadError

MAX_FEATURES = 800


def fallback_reason(num_frames: int, pairs_solved: int, median_flow_px: float, min_flow_px: float) -> str | None:
    """Return why the camera cannot be posed from these frames, or None when it can."""
    pairs = max(num_frames - 1, 0)
    if pairs == 0:
        return "a single frame has no camera motion to measure"
    if median_flow_px < min_flow_px:
        return (
            f"the camera barely moves (median frame-to-frame feature motion {median_flow_px:.2f} px < "
            f"{min_flow_px:g} px), so poses and triangulation would measure noise"
        )
    if pairs_solved < 0.5 * pairs:
        return f"only {pairs_solved} of {pairs} frame pairs gave a two-view geometry (too few matched features)"
    return None


class ClassicalDepth(DepthBackend):
    """Poses from OpenCV two-view geometry, sparse triangulated depth densified and scaled by a prior."""

    name = "classical"
    packages = ("opencv-python-headless", "opencv-python")  # whose installed version the provenance records

    def __init__(
        self,
        fov_degrees: float = 60.0,
        median_depth_m: float = 1.5,
        min_parallax_px: float = 0.7,
        min_flow_px: float = 1.0,
        densify_sigma_px: float = 24.0,
        **unknown: Any,
    ) -> None:
        check_params(type(self), unknown, "fov_degrees, median_depth_m, min_parallax_px, min_flow_px, densify_sigma_px")
        super().__init__()
        tv.fov_intrinsics(2, 2, fov_degrees)  # validates the field of view now, not mid-run
        if median_depth_m <= 0 or min_parallax_px < 0 or min_flow_px < 0 or densify_sigma_px <= 0:
            raise ValueError(
                f"median_depth_m and densify_sigma_px must be > 0, min_parallax_px and min_flow_px >= 0; got "
                f"{median_depth_m}, {densify_sigma_px}, {min_parallax_px}, {min_flow_px}"
            )
        self.fov_degrees = float(fov_degrees)
        self.median_depth_m = float(median_depth_m)
        self.min_parallax_px = float(min_parallax_px)
        self.min_flow_px = float(min_flow_px)
        self.densify_sigma_px = float(densify_sigma_px)

    def load(self, device: str) -> None:
        try:
            import cv2  # noqa: F401
        except ImportError as exc:
            raise ModelLoadError(
                f"the classical depth backend needs OpenCV ({exc}); install it with: pip install -e '.[real]'"
            ) from exc
        super().load(device)

    def infer(self, frames: np.ndarray, progress: Progress | None = None) -> DepthOutput:
        """Return depths (T, H, W) in metres, [fx, fy, cx, cy], camera->world poses (T, 4, 4) and ``notes``."""
        T, H, W = frames.shape[:3]
        intr = tv.fov_intrinsics(W, H, self.fov_degrees)
        K = tv.k_matrix(intr)
        gray = to_gray(frames)
        steps: list[tuple[np.ndarray, np.ndarray]] = []
        sparse: list[tuple[np.ndarray, np.ndarray] | None] = [None] * T
        parallax, reproj, flow, solved = [], [], [], 0
        for t in range(T - 1):
            motion, pts = self._pair(gray[t], gray[t + 1], K)
            if pts is not None and len(pts[0]):
                flow.append(float(np.median(np.linalg.norm(pts[1] - pts[0], axis=1))))
            if motion is None:
                steps.append((np.eye(3), np.zeros(3)))
            else:
                solved += 1
                parallax.append(motion.parallax_px)
                R, tr = motion.R, motion.t
                if np.linalg.norm(tr) > 0:
                    p0, p1 = pts[0][motion.inliers], pts[1][motion.inliers]
                    X = tv.triangulate(p0, p1, R, tr, K)
                    err = tv.reprojection_error_px(X, p0, p1, R, tr, K)
                    good = (X[:, 2] > 0) & (err < 2.0)
                    if good.sum() >= 8:
                        # Scale the unit translation so the median depth matches the prior.
                        scale = self.median_depth_m / float(np.median(X[good, 2]))
                        tr = tr * scale
                        sparse[t] = (p0[good], X[good, 2] * scale)
                        reproj.append(float(np.median(err[good])))
                steps.append((R, tr))
            if progress is not None and t % 8 == 7:
                progress(t + 1, T)
        E = tv.chain_poses(steps)
        max_angle = max((tv.rotation_angle_deg(e[:3, :3]) for e in E), default=0.0)
        med_parallax = float(np.median(parallax)) if parallax else 0.0
        med_flow = float(np.median(flow)) if flow else 0.0
        notes: dict[str, Any] = {
            "depth_backend": self.name,
            "fov_degrees": self.fov_degrees,
            "pairs_solved": solved,
            "pairs": T - 1,
            "median_flow_px": round(med_flow, 3),
            "median_parallax_px": round(med_parallax, 3),
            "max_rotation_deg": round(max_angle, 3),
        }
        reason = fallback_reason(T, solved, med_flow, self.min_flow_px)
        if reason:
            notes.update(
                camera="fallback", reason=f"{reason}: identity poses, fixed {self.fov_degrees:g} deg field of view"
            )
            E = np.tile(np.eye(4), (T, 1, 1))
            sparse = [None] * T
        else:
            notes["camera"] = "two-view"
        notes["frames_posed"] = 0 if notes["camera"] == "fallback" else solved + 1
        depths = self._densify(sparse, (H, W))
        notes["depth"] = "triangulated" if any(s is not None for s in sparse) else "plane-prior"
        notes["frames_with_triangulated_depth"] = sum(s is not None for s in sparse)
        if reproj and notes["camera"] != "fallback":
            notes["median_reprojection_error_px"] = round(float(np.median(reproj)), 3)
        if progress is not None:
            progress(T, T)
        return {"depths": depths, "intrinsics": intr, "cam_to_world": np.linalg.inv(E), "notes": notes}

    def _pair(self, g0: np.ndarray, g1: np.ndarray, K: np.ndarray) -> tuple[tv.Motion | None, Any]:
        import cv2

        corners = cv2.goodFeaturesToTrack(g0, MAX_FEATURES, 0.01, 7)
        if corners is None:
            return None, None
        p0 = corners.reshape(-1, 2)
        p1, kept = lk_step(g0, g1, p0, fb_max_px=1.0)
        p0, p1 = p0[kept].astype(np.float64), p1[kept].astype(np.float64)
        return tv.relative_motion(p0, p1, K, self.min_parallax_px), (p0, p1)

    def _densify(self, sparse: list[Any], shape: tuple[int, int]) -> np.ndarray:
        T = len(sparse)
        have = [t for t, s in enumerate(sparse) if s is not None]
        if not have:
            return np.repeat(tv.plane_prior_depth(shape, self.median_depth_m)[None], T, axis=0)
        # Away from the features the map leans on the plane prior at the frame's own median depth.
        dense = {
            t: tv.densify(
                shape,
                sparse[t][0],
                sparse[t][1],
                self.densify_sigma_px,
                tv.plane_prior_depth(shape, float(np.median(sparse[t][1]))),
            )
            for t in have
        }
        # A frame without its own triangulation borrows the nearest frame's map.
        nearest = np.array(have)[np.abs(np.arange(T)[:, None] - np.array(have)[None]).argmin(axis=1)]
        return np.stack([dense[int(n)] for n in nearest])

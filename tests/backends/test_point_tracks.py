"""Lucas-Kanade tracks: a known shift of a real frame recovered to sub-pixel, forward-backward on dog.mp4, lifting."""

from __future__ import annotations

import numpy as np

from tasks.backends.opencv_tracks import OpenCVTracks, OpenCVTracks2D
from tasks.backends.point_tracks import lift_tracks, lk_step, to_gray, track_pixels
from tasks.outputs.geometry import axis_angle_to_matrix
from tests.backends.real_clips import frames

K = np.array([[440.0, 0, 256], [0, 440.0, 192], [0, 0, 1]])


def shifted(image: np.ndarray, du: float, dv: float) -> np.ndarray:
    """Return ``image`` moved by (du, dv) pixels with bilinear interpolation."""
    import cv2

    M = np.array([[1.0, 0.0, du], [0.0, 1.0, dv]])
    return cv2.warpAffine(image, M, image.shape[1::-1], flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)


def corners(gray: np.ndarray, n: int) -> np.ndarray:
    import cv2

    return cv2.goodFeaturesToTrack(gray, n, 0.01, 10).reshape(-1, 2)


def test_tracks_recover_a_known_shift_of_a_real_frame_to_subpixel():
    image = frames("pstudio.mp4", 1)[0]
    shifts = [(0.0, 0.0), (2.3, -1.7), (4.6, -3.4), (6.9, -5.1)]
    clip = np.stack([shifted(image, du, dv) for du, dv in shifts])
    gray = to_gray(clip)
    queries = corners(gray[0], 64)
    queries = queries[(queries[:, 0] > 20) & (queries[:, 0] < 490) & (queries[:, 1] > 20) & (queries[:, 1] < 360)]
    tracks, visible = track_pixels(gray, queries, fb_max_px=1.0)
    assert visible[-1].mean() > 0.9
    for t, (du, dv) in enumerate(shifts):
        err = np.linalg.norm(tracks[t, visible[-1]] - (queries[visible[-1]] + [du, dv]), axis=1)
        assert np.median(err) < 0.1 and err.max() < 0.5, (
            f"step {t}: median {np.median(err):.3f} px, max {err.max():.3f}"
        )


def test_tracks_survive_the_forward_backward_check_on_hand_held_footage():
    clip = frames("dog.mp4", 10, step=3)  # about 10 fps, as preprocess gives
    gray = to_gray(clip)
    queries = corners(gray[0], 64)
    out = OpenCVTracks2D(fb_max_px=1.0).track2d(clip, queries)
    kept = out["visible"][-1]
    # Hand-held, 10 fps, 9-30 px of motion a frame: about 3 in 10 corners last the 10 frames
    # (the rest meet occlusion or blur and fail the round trip by tens of pixels).
    assert kept.mean() >= 0.25, f"only {kept.mean():.0%} of the points survived 10 frames"
    # Every kept step passes the round trip it was checked with.
    for t in range(1, len(clip)):
        alive = out["visible"][t]
        back, ok = lk_step(gray[t], gray[t - 1], out["tracks"][t, alive], fb_max_px=np.inf)
        assert np.median(np.linalg.norm(back[ok] - out["tracks"][t - 1, alive][ok], axis=1)) < 1.0
    # Lost points stay lost and read NaN.
    lost = ~out["visible"]
    assert np.isnan(out["tracks"][lost]).all() and not (lost[:-1] & ~lost[1:]).any()


def test_a_point_that_leaves_the_frame_is_dropped():
    image = frames("pstudio.mp4", 1)[0]
    clip = np.stack([shifted(image, 8.0 * t, 0.0) for t in range(4)])
    tracks, visible = track_pixels(to_gray(clip), np.array([[505.0, 200.0], [100.0, 200.0]], np.float32))
    assert not visible[-1, 0] and visible[-1, 1]


def test_lifting_moves_each_step_into_the_first_camera():
    points = np.array([[0.1, -0.2, 1.5], [-0.3, 0.1, 2.0]])
    E = np.tile(np.eye(4), (2, 1, 1))
    E[1, :3, :3] = axis_angle_to_matrix(np.array([0.0, 0.1, 0.0]))
    E[1, :3, 3] = [0.05, 0.0, 0.02]
    cam1 = points @ E[1, :3, :3].T + E[1, :3, 3]  # world = camera 0

    def px(P):
        h = P @ K.T
        return h[:, :2] / h[:, 2:3]

    pixels = np.stack([px(points), px(cam1)])
    depths = np.zeros((2, 384, 512), np.float32)
    for t, P in enumerate((points, cam1)):
        u, v = np.round(pixels[t]).astype(int).T
        depths[t, v, u] = P[:, 2]
    pixels = np.round(pixels)  # depth is read at the nearest pixel
    out = lift_tracks(pixels, depths, np.stack([K, K]), E)
    assert np.allclose(out[1], out[0], atol=0.01)


def test_3d_backend_returns_the_queries_at_step_0_and_nan_once_lost():
    image = frames("pstudio.mp4", 1)[0]
    clip = np.stack([shifted(image, 2.0 * t, 0.0) for t in range(5)])
    depths = np.full((5, 384, 512), 1.5, np.float32)
    pixels = np.array([[100.0, 100.0], [508.0, 300.0]])
    queries = np.c_[(pixels - [256, 192]) * 1.5 / 440.0, [1.5, 1.5]]
    out = OpenCVTracks().track(
        clip, queries, depths, np.tile(K, (5, 1, 1)), np.tile(np.eye(4), (5, 1, 1)), query_pixels=pixels
    )
    assert np.allclose(out[0], queries)
    assert np.isfinite(out[:, 0]).all() and np.isnan(out[-1, 1]).all()
    assert np.isclose(out[-1, 0, 0] - out[0, 0, 0], 8.0 * 1.5 / 440.0, atol=2e-3)

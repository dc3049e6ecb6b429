"""The adapters' conversions on arrays shaped as the upstream models return them, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.backends.convert_tracks import (
    cotracker_queries,
    cotracker_visible,
    drop_not_always_visible,
    erode,
    grid_on_mask,
    tapip3d_to_first_camera,
    tapip3d_window_inputs,
)
from tasks.backends.convert_vipe import stack_vipe_outputs, vipe_overrides, world_to_camera
from tasks.backends.convert_wilor import (
    backproject,
    best_per_side,
    full_image_translation,
    place_hand,
    wrist_depth,
    wrist_pixel,
)
from tasks.backends.grounded_sam import detector_prompt, key_frame
from tasks.backends.sam3 import sam3_prompt, union_of_objects

RZ90 = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # +90 degrees about z
RY90 = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])  # +90 degrees about y


def pose(R: np.ndarray, t: tuple[float, float, float]) -> np.ndarray:
    P = np.eye(4)
    P[:3, :3], P[:3, 3] = R, t
    return P


# ViPE


def test_vipe_overrides_are_y2rs_for_its_config() -> None:
    # y2r's config.yaml: lyra, fov 60-90, optimize_intrinsics true, no fixed fov.
    assert vipe_overrides("lyra", "/tmp/v", None, 60, 90, True) == [
        "pipeline=lyra",
        "pipeline.output.path=/tmp/v",
        "pipeline.output.save_artifacts=false",
        "pipeline.output.save_viz=false",
        "pipeline.init.fov_min_degrees=60",
        "pipeline.init.fov_max_degrees=90",
        "+pipeline.slam.fov_min_degrees=60",
        "+pipeline.slam.fov_max_degrees=90",
        "pipeline.slam.optimize_intrinsics=true",
    ]
    fixed = vipe_overrides("default", "/o", 70, None, None, False)
    assert "pipeline.init.fixed_fov_degrees=70" in fixed and fixed[-1] == "pipeline.slam.optimize_intrinsics=false"
    assert not any("fov_min" in o for o in fixed)


def test_camera_to_world_pose_inverts_to_the_known_world_to_camera() -> None:
    # Camera at (1, 2, 3) turned +90 degrees about z: world->camera is [R^T, -R^T t] = [Rz(-90), (-2, 1, -3)].
    inv = world_to_camera(pose(RZ90, (1.0, 2.0, 3.0)))
    np.testing.assert_allclose(inv[:3, :3], [[0, 1, 0], [-1, 0, 0], [0, 0, 1]], atol=1e-12)
    np.testing.assert_allclose(inv[:3, 3], [-2.0, 1.0, -3.0], atol=1e-12)
    # The camera's own centre maps to the camera origin.
    np.testing.assert_allclose(inv @ [1.0, 2.0, 3.0, 1.0], [0, 0, 0, 1], atol=1e-12)


def test_vipe_stream_attributes_stack_to_the_depth_contract() -> None:
    T, H, W = 5, 384, 512
    poses = [pose(RZ90, (0.1 * t, 0.0, 0.0)) for t in range(T)]
    depths = [np.full((H, W), 1.0 + t, np.float32) for t in range(T)]
    # ViPE gives [fx, fy, cx, cy, *distortion] per frame; y2r keeps the first one present.
    intrinsics = [None, np.array([400.0, 410.0, 256.0, 192.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0, 1.0])] + [None] * 2
    out = stack_vipe_outputs(poses, depths, intrinsics, (T, H, W))
    assert out["cam_to_world"].shape == (T, 4, 4) and out["cam_to_world"].dtype == np.float64
    assert out["depths"].shape == (T, H, W) and out["depths"].dtype == np.float32
    np.testing.assert_array_equal(out["intrinsics"], [400.0, 410.0, 256.0, 192.0])
    with pytest.raises(ValueError, match="4 poses and 5 depth maps for 5 frames"):
        stack_vipe_outputs(poses[:4], depths, intrinsics, (T, H, W))
    with pytest.raises(ValueError, match=r"depth maps are \(192, 256\) but the frames are \(384, 512\)"):
        stack_vipe_outputs(poses, [d[::2, ::2] for d in depths], intrinsics, (T, H, W))
    with pytest.raises(ValueError, match="no intrinsics"):
        stack_vipe_outputs(poses, depths, [None] * T, (T, H, W))


# TAPIP3D


def test_tapip3d_gets_y2rs_relative_poses_and_first_camera_queries() -> None:
    L = 10
    E = np.stack([pose(RZ90, (0.0, 0.0, 0.0)) @ pose(np.eye(3), (0.01 * t, 0.0, 0.5)) for t in range(L)])
    queries = np.array([[0.1, -0.2, 0.8], [0.0, 0.0, 1.5]])
    query_point, poses = tapip3d_window_inputs(queries, E)
    assert query_point.shape == (2, 4) and poses.shape == (L, 4, 4)
    np.testing.assert_allclose(poses[0], np.eye(4), atol=1e-6)  # TAPIP3D's world is the first camera
    np.testing.assert_allclose(poses[3], np.linalg.inv(E[0]) @ E[3], atol=1e-6)  # inv(E_0) @ E_t, y2r's order
    np.testing.assert_array_equal(query_point[:, 0], [0.0, 0.0])
    np.testing.assert_allclose(query_point[:, 1:], queries, atol=1e-6)


def test_world_frame_track_lands_on_its_known_first_camera_position() -> None:
    L, N = 10, 64
    # world->camera 0: +90 degrees about y, then (0.5, 0, 3). World (1, 0, 2) -> R p = (2, 0, -1) -> (2.5, 0, 2).
    w2c0 = pose(RY90, (0.5, 0.0, 3.0))
    coords = np.zeros((L, N, 3), np.float32)  # TAPIP3D's inference returns (T, N, 3) after its squeeze
    coords[:, 0] = [1.0, 0.0, 2.0]
    coords[:, 1] = np.array([1.0, 0.0, 2.0]) + np.arange(L)[:, None] * [0.0, 0.1, 0.0]  # moves along world y
    visible = np.ones((L, N), bool)
    visible[7, 5] = False  # lost at step 7: y2r drops the whole point
    cam = tapip3d_to_first_camera(coords, visible, w2c0)
    assert cam.shape == (L, N, 3) and cam.dtype == np.float32
    np.testing.assert_allclose(cam[:, 0], np.tile([2.5, 0.0, 2.0], (L, 1)), atol=1e-6)
    np.testing.assert_allclose(cam[4, 1], [2.5, 0.4, 2.0], atol=1e-6)  # world y is camera y under Ry
    assert np.isnan(cam[:, 5]).all() and not np.isnan(np.delete(cam, 5, axis=1)).any()


def test_one_query_point_squeezed_by_tapip3d_keeps_its_axis() -> None:
    # inference() ends with .squeeze(): one point comes back as (T, 3) and (T,).
    cam = tapip3d_to_first_camera(np.ones((10, 3)), np.ones(10, bool), np.eye(4))
    assert cam.shape == (10, 1, 3)


def test_erosion_matches_opencv_square_kernel_and_border_rule() -> None:
    mask = np.zeros((20, 20), bool)
    mask[5:12, 5:12] = True  # 7x7
    eroded = erode(mask, 2)
    assert eroded.sum() == 9 and eroded[7:10, 7:10].all()
    edge = np.zeros((20, 20), bool)
    edge[:, :6] = True  # touches the left border: cv2's border counts as set, only the right side shrinks
    np.testing.assert_array_equal(erode(edge, 2)[:, :4], True)
    assert not erode(edge, 2)[:, 4:].any()
    np.testing.assert_array_equal(erode(mask, 0), mask)


# CoTracker3


def test_cotracker_grid_on_a_full_mask_is_its_64x64_grid() -> None:
    pts = grid_on_mask(np.ones((384, 512), bool), 64)
    assert pts.shape == (4096, 2)
    np.testing.assert_allclose(pts[0], [8.0, 8.0])  # margin W / 64 = 8 px on both axes
    np.testing.assert_allclose(pts[-1], [504.0, 376.0])
    np.testing.assert_allclose(pts[1] - pts[0], [(512 - 16) / 63, 0.0])  # row-major
    left = np.zeros((384, 512), bool)
    left[:, :256] = True
    kept = grid_on_mask(left, 64)
    assert len(kept) == 64 * 32 and (kept[:, 0] < 256).all()


def test_cotracker_queries_and_y2r_visibility_rule() -> None:
    q = cotracker_queries(np.array([[10.0, 20.0], [30.0, 40.0]]))
    np.testing.assert_array_equal(q, [[[0, 10, 20], [0, 30, 40]]])
    # The predictor returns booleans (already > 0.9): y2r's > 0.95 keeps exactly the True steps.
    flags = np.array([[[True, False], [True, True]]])
    np.testing.assert_array_equal(cotracker_visible(flags, 0.95), [[True, False], [True, True]])
    np.testing.assert_array_equal(cotracker_visible(np.array([[[0.96, 0.94]]]), 0.95), [[True, False]])
    kept = drop_not_always_visible(np.ones((2, 2, 2)), cotracker_visible(flags, 0.95))
    assert np.isnan(kept[:, 1]).all() and (kept[:, 0] == 1).all()  # point 1 hidden at step 0: dropped


# WiLoR


def test_pred_cam_gives_the_full_image_translation_of_wilors_formula() -> None:
    # s = 0.5, box 100 px centred at (300, 200) in a 512x384 image; focal 5000 / 256 * 512 = 10000.
    # bs = 50; tz = 2 * 10000 / 50 = 400; tx = 2 * (300 - 256) / 50 + 0.1 = 1.86;
    # ty = 2 * (200 - 192) / 50 - 0.2 = 0.12.
    # A left hand flips tx of the crop camera: 1.76 - 0.1 = 1.66.
    cam_t, focal = full_image_translation(
        pred_cam=np.array([[0.5, 0.1, -0.2], [0.5, 0.1, -0.2]]),
        box_center=np.array([[300.0, 200.0], [300.0, 200.0]]),
        box_size=np.array([100.0, 100.0]),
        img_size=np.array([[512.0, 384.0], [512.0, 384.0]]),
        is_right=np.array([1.0, 0.0]),
        focal_length=5000.0,
        model_image_size=256.0,
    )
    np.testing.assert_allclose(focal, [10000.0, 10000.0])
    np.testing.assert_allclose(cam_t[0], [1.86, 0.12, 400.0], atol=1e-6)
    np.testing.assert_allclose(cam_t[1], [1.66, 0.12, 400.0], atol=1e-6)


def test_wrist_pixel_depth_lookup_and_backprojection() -> None:
    joints = np.zeros((21, 3))
    # (1.86, 0.12, 400) with f = 10000: u = 46.5 + 256 -> 302, v = 3 + 192 -> 195.
    assert wrist_pixel(joints, np.array([1.86, 0.12, 400.0]), 10000.0, 512, 384) == (302, 195)
    assert wrist_pixel(joints, np.array([100.0, -100.0, 1.0]), 10000.0, 512, 384) == (511, 0)  # clipped
    depth = np.zeros((384, 512), np.float32)
    depth[194, 302] = np.nan  # 1 px up: not finite
    depth[197, 302] = 0.6  # 2 px down comes before 2 px right
    depth[195, 304] = 0.7
    assert wrist_depth(depth, 302, 195) == pytest.approx(0.6)
    depth[195, 302] = 0.5
    assert wrist_depth(depth, 302, 195) == pytest.approx(0.5)
    assert wrist_depth(np.zeros((384, 512)), 302, 195) is None
    K = np.array([[400.0, 0, 256.0], [0, 400.0, 192.0], [0, 0, 1]])
    # d = 0.5 + 0.02: x = 46 * 0.52 / 400, y = 3 * 0.52 / 400.
    np.testing.assert_allclose(backproject(302, 195, 0.52, K), [0.0598, 0.0039, 0.52], atol=1e-9)


def test_hand_is_placed_with_global_orient_at_the_wrist() -> None:
    joints = np.zeros((21, 3))
    joints[0] = [5.0, 5.0, 5.0]  # WiLoR's own wrist position is discarded
    joints[1] = [5.1, 5.0, 5.0]
    wrist_pose, joints_cam = place_hand(RZ90[None], joints, np.array([0.1, 0.2, 0.6]))
    np.testing.assert_allclose(wrist_pose, pose(RZ90, (0.1, 0.2, 0.6)))
    np.testing.assert_allclose(joints_cam[0], [0.1, 0.2, 0.6])
    np.testing.assert_allclose(joints_cam[1], [0.1, 0.3, 0.6], atol=1e-12)  # x offset turned to +y


def test_best_detection_per_side() -> None:
    assert best_per_side(np.array([0.8, 0.9, 0.95, 0.7]), np.array([1, 1, 0, 0])) == {"left": 2, "right": 1}
    assert best_per_side(np.array([0.8, 0.8]), np.array([1.0, 1.0])) == {"left": None, "right": 0}
    assert best_per_side(np.zeros(0), np.zeros(0)) == {"left": None, "right": None}


# Grounded SAM


def test_prompt_and_key_frame_rules() -> None:
    assert detector_prompt(" red t-shaped block ") == "red t-shaped block."
    assert detector_prompt("mug.") == "mug."
    assert key_frame(9, -1) == 4 and key_frame(9, 0) == 0


def test_sam3_gets_y2rs_prompt_without_its_period() -> None:
    # y2r's grounded_sam2.py:424 strips trailing periods only.
    assert sam3_prompt("red t-shaped block.") == "red t-shaped block"
    assert sam3_prompt("mug..") == "mug" and sam3_prompt(" cup ") == " cup "


def test_sam3_objects_merge_into_one_mask_per_frame() -> None:
    a = np.zeros((2, 4, 6), bool)
    a[0, 0, 0] = a[1, 3, 5] = True
    small = np.zeros((1, 2, 3), bool)
    small[0, 1, 2] = True  # at half size: nearest neighbour spreads it over the bottom-right 2x2
    outputs = {
        0: {"out_obj_ids": np.array([3, 7]), "out_binary_masks": a},
        2: {"out_obj_ids": np.array([3]), "out_binary_masks": small},
        1: {"out_obj_ids": np.array([], np.int64), "out_binary_masks": np.zeros((0, 4, 6), bool)},
    }
    union = union_of_objects(outputs, (3, 4, 6))
    assert union is not None and union.dtype == bool and union.shape == (3, 4, 6)
    assert union[0].sum() == 2 and union[0, 0, 0] and union[0, 3, 5]
    assert not union[1].any()
    assert union[2, 2:, 4:].all() and union[2].sum() == 4
    # No object on any frame: no mask, as y2r (grounded_sam2.py:539-541).
    assert union_of_objects({1: outputs[1]}, (3, 4, 6)) is None

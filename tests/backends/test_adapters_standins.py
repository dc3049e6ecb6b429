"""The adapters' call path (load, batching, conversion) against upstream stand-ins, through real workers.

The GPU worker runs from a throwaway venv holding the stand-ins (tests/standins), as it
would run from the models' environment; the CPU worker and the scripts run from the
project's. The dataset must verify, and the values the stand-ins were built to give must
come out of the contracts' files.
"""

from __future__ import annotations

import json
import math
import os
import subprocess

import numpy as np
import pytest

from tasks.backends.convert_wilor import backproject
from tests.backends.standin_env import ROOT, lay_out_upstream, real_gpu_settings, real_gpu_yaml_on, standin_python
from tests.conftest import run_script, settings_env, task_result, wait_until
from tests.standins.site.ultralytics import right_hand_x


@pytest.fixture(scope="session")
def standin_py() -> str:
    return str(standin_python())


def rz(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def test_dataset_from_the_adapters_and_standins_verifies(video_factory, workers, pipeline_env, tmp_path, standin_py):
    dirs = lay_out_upstream(tmp_path / "upstream")
    env = settings_env(tmp_path, real_gpu_settings(dirs))
    workers.start("cpu", env=env)
    workers.start("gpu0", env=env, python=standin_py)
    raw, out = video_factory(2), tmp_path / "out"
    sent = run_script("enqueue_dataset.py", str(raw), "--out", str(out), "--no-wait", env={**pipeline_env, **env})
    assert sent.returncode == 0, sent.stdout + sent.stderr
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    meta = wait_until(lambda: task_result(pipeline_env["REDIS_URL"], record["callback_id"]), 240, "the run", poll_s=0.5)
    summary = json.loads((out / "run_summary.json").read_text())
    assert meta["status"] == "SUCCESS" and summary["done"] == 2, (summary, workers.log("gpu0"))
    assert workers.state("gpu0")["model_loads"] == {"depth": 1, "tracks": 1, "hands": 1}
    check = run_script("verify_dataset.py", str(out), env=pipeline_env)
    assert check.returncode == 0, check.stdout + check.stderr

    work = next((out / "work").iterdir())
    depth = np.load(work / "depth.npz")
    T = len(depth["extrinsics"])
    # The stand-in's camera->world pose is Rz(0.05 t) at (0.01, -0.02, 0.03) t: world->camera is [R^T, -R^T c].
    for t in (0, 1, T - 1):
        R, c = rz(0.05 * t), np.array([0.01, -0.02, 0.03]) * t
        np.testing.assert_allclose(depth["extrinsics"][t, :3, :3], R.T, atol=1e-6)
        np.testing.assert_allclose(depth["extrinsics"][t, :3, 3], -R.T @ c, atol=1e-6)
    # GeoCalib's 50 degree estimate clamped to y2r's 60 degree minimum: fy = 192 / tan(30 degrees).
    np.testing.assert_allclose(depth["intrinsics"][0], [[332.5537, 0, 256], [0, 332.5537, 192], [0, 0, 1]], rtol=1e-5)

    tracks = np.load(work / "tracks.npz")
    assert (tracks["num_points"] == 64).all()
    # The stand-in drifts every query by (0.01, 0.005, 0) m per step in TAPIP3D's world: y2r's window poses
    # make that world the window's first camera, so the tracks move so in that camera's frame.
    steps = np.arange(10)[:, None, None] * np.array([0.01, 0.005, 0.0])
    np.testing.assert_allclose(
        tracks["tracks"][:, :, :64] - tracks["tracks"][:, :1, :64],
        np.broadcast_to(steps, tracks["tracks"][:, :, :64].shape),
        atol=1e-5,
    )

    hands = np.load(work / "hands.npz")
    frames = np.load(work / "preprocess.npz")["frames"]
    K = depth["intrinsics"][0]
    valid = np.flatnonzero(hands["right_valid"])
    position = hands["right_wrist_pose"][:, :3, 3]
    raw, matched = {}, []
    for t in valid:
        # The detector stand-in's box follows the frame's bytes; the crop camera puts the wrist at the box
        # centre; its depth plus 2 cm, back-projected.
        cx = right_hand_x(frames[t])
        u, v = int(cx), int(0.52 * 384)
        raw[t] = backproject(u, v, float(depth["depths"][t, v, u].astype(np.float32)) + 0.02, K)
        if np.allclose(position[t], raw[t], atol=1e-5):
            np.testing.assert_allclose(hands["right_wrist_pose"][t, :3, :3], rz(cx / 1000.0), atol=1e-5)
            matched.append(t)
    assert len(matched) >= 5, (valid, matched)
    # Every other valid frame was dropped by the velocity gate (or not detected) and filled in linearly
    # between the kept frames around it.
    for t in sorted(set(valid) - set(matched)):
        before, after = max(m for m in matched if m < t), min(m for m in matched if m > t)
        a = (t - before) / (after - before)
        np.testing.assert_allclose(position[t], (1 - a) * raw[before] + a * raw[after], atol=1e-5)
    # Median of the right hand's betas: 0.1 k + box size 160 / 1e4 for every detection.
    np.testing.assert_allclose(hands["right_betas"], 0.1 * np.arange(10) + 0.016, atol=1e-6)


SCRIPT = """
import json, sys
import numpy as np
from tasks.backends.convert_tracks import erode, grid_on_mask
from tasks.backends import get_backend

cot, gsam = sys.argv[1], sys.argv[2]
frames = np.zeros((10, 384, 512, 3), np.uint8)
frames[:, 100:200, 300:420] = 220  # a bright block
mask = np.zeros((384, 512), bool)
mask[100:200, 300:420] = True

tracker = get_backend("tracks2d", "cotracker", weights_dir=cot)
tracker.load("cpu")
pixels = grid_on_mask(erode(mask, 2), 64)
out2d = tracker.track2d(frames, pixels)

masks = get_backend("masks", "grounded_sam", weights_dir=gsam)
masks.load("cpu")
found = masks.segment(frames, "red block")
missing = masks.segment(frames, "mug")
print(json.dumps({
    "pixels": pixels.tolist(), "tracks": out2d["tracks"].tolist(), "visible": out2d["visible"].tolist(),
    "found": [int(found.sum()), bool(found[:, 100:200, 300:420].all())], "missing": missing is None,
}))
"""


def test_cotracker_and_grounded_sam_adapters_run_their_standins(tmp_path, standin_py):
    dirs = lay_out_upstream(tmp_path / "upstream")
    run = subprocess.run(
        [standin_py, "-c", SCRIPT, str(dirs["cotracker"]), str(dirs["gsam"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"},
    )
    assert run.returncode == 0, run.stderr
    res = json.loads(run.stdout.strip().splitlines()[-1])
    pixels, tracks, visible = np.array(res["pixels"]), np.array(res["tracks"]), np.array(res["visible"])
    # The 64-grid over 512x384 steps 496 / 63 px in x and 368 / 63 px in y from a margin of 8 px: the eroded
    # block (x 302-417, y 102-197) holds columns 38-52 (15) and rows 17-32 (16) of it.
    assert pixels.shape == (15 * 16, 2) and (pixels[:, 0] > 300).all() and (pixels[:, 1] < 200).all()
    assert tracks.shape == (10, len(pixels), 2) and visible.shape == (10, len(pixels))
    hidden = np.arange(len(pixels)) % 7 == 3  # the stand-in hides these at step 5 only
    assert not visible[5, hidden].any() and visible[5, ~hidden].all() and visible[[0, 4, 6, 9]].all()
    shown = ~hidden
    np.testing.assert_allclose(tracks[0, shown], pixels[shown], atol=1e-4)
    np.testing.assert_allclose(tracks[9, shown] - tracks[0, shown], np.tile([13.5, -4.5], (shown.sum(), 1)), atol=1e-4)
    assert np.isnan(tracks[:, hidden]).all()  # y2r drops a point hidden at any step
    # The bright block's box, followed by SAM 2 through every frame; nothing named "mug": no mask (y2r saves none).
    assert res["found"] == [10 * 100 * 120, True]
    assert res["missing"] is True


SAM3_SCRIPT = """
import json, os, sys
import numpy as np
from tasks.backends import get_backend
from tasks.errors import ModelLoadError
from sam3.model_builder import Sam3VideoPredictor

weights = sys.argv[1]
frames = np.zeros((10, 384, 512, 3), np.uint8)
for t in range(10):
    frames[t, 100:200, 300 + 10 * t:420 + 10 * t] = 220  # a bright block moving 10 px per frame
late = frames.copy()
late[:5] = 0  # the block appears at frame 5
masks = get_backend("masks", "sam3", weights_dir=weights)
masks.load("cpu")
found = masks.segment(frames, "red block.")
middle = masks.segment(late, "red block")
missing = masks.segment(frames, "mug")
far = get_backend("masks", "sam3", weights_dir=weights, key_frame_idx=99)
far.load("cpu")
beyond = far.segment(late, "red block")
os.environ["FRAMEFLEET_STANDIN_SAM3_CPU"] = "0"
try:
    get_backend("masks", "sam3", weights_dir=weights).load("cpu")
    refused = None
except ModelLoadError as exc:
    refused = str(exc)
bright = frames.mean(axis=-1) > 150
print(json.dumps({
    "found": bool(np.array_equal(found, bright)), "dtype": str(found.dtype),
    "middle": bool(np.array_equal(middle, late.mean(axis=-1) > 150)), "middle_any": middle.any(axis=(1, 2)).tolist(),
    "beyond": bool(np.array_equal(beyond, middle)), "missing": missing is None,
    "open_sessions": len(Sam3VideoPredictor._ALL_INFERENCE_STATES), "refused": refused,
}))
"""


def test_sam3_adapter_runs_its_standin(tmp_path, standin_py):
    dirs = lay_out_upstream(tmp_path / "upstream")
    run = subprocess.run(
        [standin_py, "-c", SAM3_SCRIPT, str(dirs["sam3"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"},
    )
    assert run.returncode == 0, run.stderr
    res = json.loads(run.stdout.strip().splitlines()[-1])
    # The moving block, frame by frame in order, read losslessly from the frames SAM 3 was given.
    assert res["found"] and res["dtype"] == "bool"
    # Nothing on the key frame 0: SAM 3 is prompted on the middle frame (5) and propagates both ways.
    assert res["middle"] and res["middle_any"] == [False] * 5 + [True] * 5
    # A key frame past the video finds nothing, so the middle frame is tried, as in y2r.
    assert res["beyond"]
    assert res["missing"] is True  # nothing named "mug": no mask (y2r saves none)
    assert res["open_sessions"] == 0  # every session closed, found or not
    assert res["refused"] is not None and "CUDA only" in res["refused"] and "'cpu'" in res["refused"]


DEPTH_ROI_SCRIPT = """
import json, sys
import numpy as np
from tasks.errors import BadInput, PermanentError, error_class
from tasks.stages.tracks import TracksStage

stage = TracksStage(backend="tapip3d", repo_dir=sys.argv[1], window_length=10, target_points=64)
stage.load("cpu")
T, H, W = 10, 48, 64
K = np.array([[50.0, 0, W / 2], [0, 50.0, H / 2], [0, 0, 1]], np.float32)
inputs = {"frames": np.zeros((T, H, W, 3), np.uint8), "intrinsics": np.tile(K, (T, 1, 1)),
          "extrinsics": np.tile(np.eye(4, dtype=np.float32), (T, 1, 1))}
out = {}
for n in (3, 4):
    depths = np.zeros((T, H, W), np.float32)
    depths[0, 10, 10:10 + n] = 1.5  # n pixels of depth in the whole window, all on the query frame
    try:
        tracks = stage.run({**inputs, "depths": depths})
        out[n] = {"points": tracks["num_points"].tolist()}
    except Exception as exc:
        out[n] = {"class": error_class(exc), "permanent": isinstance(exc, PermanentError), "message": str(exc)}
print(json.dumps(out))
"""


def test_tapip3d_depth_roi_with_too_few_depths_fails_the_video_with_its_reason(tmp_path, standin_py):
    dirs = lay_out_upstream(tmp_path / "upstream")
    run = subprocess.run(
        [standin_py, "-c", DEPTH_ROI_SCRIPT, str(dirs["tapip3d"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"},
    )
    assert run.returncode == 0, run.stderr
    res = json.loads(run.stdout.strip().splitlines()[-1])
    # Three depths: TAPIP3D's kthvalue would raise; the stage fails the video with a permanent error (the run
    # quarantines it, recording the class and this reason) instead of an unexplained RuntimeError.
    failed = res["3"]
    assert failed["class"] == "BadInput" and failed["permanent"], failed
    assert "3 pixels of positive depth" in failed["message"] and "at least 4" in failed["message"]
    assert "inference_utils.py:121-124" in failed["message"]
    assert res["4"] == {"points": [4]}  # four are enough for TAPIP3D's depth range


CAPPED = """
import json, sys
import numpy as np
from tasks.backends import get_backend

frames = np.zeros((6, 384, 512, 3), np.uint8)
frames[:, 100:200, 300:420] = 220  # a bright block, scored 0.9; the detector's other queries score 0.1
out = {}
for cap in (None, 1):
    masks = get_backend("masks", "grounded_sam", weights_dir=sys.argv[1], box_threshold=0.05, max_objects=cap)
    masks.load("cpu")
    found = masks.segment(frames, "red block")
    out[str(cap)] = [len(masks._boxes(frames[0], "red block.")), int(found.sum()), bool(found[:, 190, 250].all())]
print(json.dumps(out))
"""


def test_max_objects_keeps_the_best_boxes_only(tmp_path, standin_py):
    dirs = lay_out_upstream(tmp_path / "upstream")
    run = subprocess.run(
        [standin_py, "-c", CAPPED, str(dirs["gsam"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"},
    )
    assert run.returncode == 0, run.stderr
    res = json.loads(run.stdout.strip().splitlines()[-1])
    # Every query clears a 0.05 threshold: SAM 2 follows all of them, the block and the weak boxes around the centre.
    boxes, area, centre = res["None"]
    assert boxes > 1 and area > 6 * 100 * 120 and centre
    # At most one object: the highest-scoring box, the block, alone.
    assert res["1"] == [1, 6 * 100 * 120, False]


MISSING = [
    pytest.param(
        "depth: {{backend: vipe, params: {{weights_dir: '{vipe}'}}}}",
        False,
        ["Python module 'vipe'", "bash deploy/envs/build.sh vipe"],
        id="package",
    ),
    pytest.param(
        "depth: {{backend: vipe, params: {{weights_dir: '{base}/nowhere'}}}}",
        True,
        ["ViPE's model cache", "nowhere is not a folder", "vipe infer"],
        id="vipe-cache",
    ),
    pytest.param(
        "tracks: {{backend: tapip3d, params: {{repo_dir: '{base}/no-checkout'}}}}",
        True,
        ["the TAPIP3D checkout", "no-checkout is not a folder", "git clone https://github.com/zbw001/TAPIP3D"],
        id="checkout",
    ),
    pytest.param(
        "tracks: {{backend: tapip3d, params: {{repo_dir: '{tapip3d}', checkpoint: gone.pth}}}}",
        True,
        ["the TAPIP3D checkpoint is missing", "gone.pth", "wget https://huggingface.co/zbww/tapip3d"],
        id="weights",
    ),
    pytest.param(
        "hands: {{backend: wilor, params: {{repo_dir: '{wilor}'}}}}",
        True,
        ["the MANO right-hand model is missing", "MANO_RIGHT.pkl", "https://mano.is.tue.mpg.de"],
        id="mano",
    ),
]


@pytest.mark.parametrize(("stage_yaml", "in_standin_env", "expected"), MISSING)
def test_a_missing_piece_stops_the_worker_naming_the_fix(
    stage_yaml, in_standin_env, expected, workers, tmp_path, standin_py
):
    base = tmp_path / "upstream"
    dirs = lay_out_upstream(base)
    (dirs["wilor"] / "mano_data" / "MANO_RIGHT.pkl").unlink()  # only the "mano" case loads WiLoR
    text = "stages:\n  " + stage_yaml.format(base=base, **dirs) + "\n"
    env = settings_env(tmp_path, text)
    proc = workers.start("gpu0", env=env, wait=False, python=standin_py if in_standin_env else None)
    assert proc.wait(timeout=120) == 3
    log = workers.log("gpu0")
    for phrase in expected:
        assert phrase in log, log
    assert "exits without consuming tasks" in log
    assert workers.state("gpu0") is None  # it never registered, so it never took a task


def test_real_gpu_config_runs_each_model_in_its_own_environment(video_factory, pipeline_env, tmp_path, standin_py):
    models = tmp_path / "models"
    lay_out_upstream(models)
    raw, out = video_factory(2), tmp_path / "out"
    env = {k: v for k, v in pipeline_env.items() if k != "REDIS_URL"}
    env.update(settings_env(tmp_path, real_gpu_yaml_on(models, standin_py)))
    done = run_script("run_local.py", str(raw), "--out", str(out), "--cpu-workers", "1", env=env, timeout_s=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    host = os.uname().nodename
    for stage in ("masks", "depth", "tracks", "tracks2d", "hands"):
        # Each model stage ran on its own queue, in a worker started from the stage's interpreter.
        ran = summary["stages"][stage]["workers"]
        assert sum(ran.values()) == 2, ran
        assert all(w.startswith(f"gpu0.{stage}-") and w.endswith(f"@{host}") for w in ran), ran
    check = run_script("verify_dataset.py", str(out), env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    work = next((out / "work").iterdir())
    masks = np.load(work / "masks.npz")["masks"]
    tracks2d = np.load(work / "tracks2d.npz")
    assert masks.dtype == bool and masks.shape[1:] == (384, 512)
    n = int(tracks2d["num_points"][0])
    # CoTracker's stand-in: every query moves (1.5, -0.5) px per step, and point 3 mod 7 is hidden at step 5,
    # which drops it (NaN), as y2r does.
    hidden = np.arange(n) % 7 == 3
    moved = tracks2d["tracks"][0, 9, :n] - tracks2d["tracks"][0, 0, :n]
    np.testing.assert_allclose(moved[~hidden], np.tile([13.5, -4.5], ((~hidden).sum(), 1)), atol=1e-4)
    assert np.isnan(moved[hidden]).all()
    assert not tracks2d["visible"][0, 5, :n][hidden].any() and tracks2d["visible"][0, 4, :n].all()

"""The stand-ins behave like the upstream code where our adapters depend on it (each check cites upstream).

One probe runs in the stand-ins' venv and reports what each stand-in does; every test below
would fail against the stand-ins as they were before they were made to follow upstream.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from tests.backends.standin_env import ROOT, lay_out_upstream, standin_python

PROBE = r"""
import json, os, sys, math
from pathlib import Path
import numpy as np
import torch

out = {}
base = Path(sys.argv[1])

def error(fn):
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None

# --- WiLoR (checkout stand-in on the path) ---
os.chdir(base / "WiLoR")
sys.path.insert(0, str(base / "WiLoR"))
out["wilor_import_without_platform"] = error(lambda: __import__("wilor.utils"))
os.environ["PYOPENGL_PLATFORM"] = "egl"
out["wilor_import_with_egl_only"] = error(lambda: __import__("wilor.utils"))
os.environ["PYGLET_HEADLESS"] = "true"
for name in [m for m in sys.modules if m.startswith("wilor")]:
    del sys.modules[name]
from wilor.models import load_wilor, CANONICAL_JOINTS
from wilor.datasets.vitdet_dataset import ViTDetDataset
ckpt, cfg_path = "pretrained_models/wilor_final.ckpt", "pretrained_models/model_config.yaml"
out["wilor_plain_load"] = error(lambda: load_wilor(ckpt, cfg_path))
original = torch.load
torch.load = lambda *a, **k: original(*a, **{**k, "weights_only": False})
model, cfg = load_wilor(ckpt, cfg_path)
torch.load = original
item = ViTDetDataset(cfg, np.zeros((384, 512, 3), np.uint8), np.array([[100, 100, 200, 220]]), np.array([1.0]),
                     rescale_factor=2.0)[0]
out["wilor_crop"] = list(item["img"].shape)
batch = {k: torch.from_numpy(np.stack([v])) if isinstance(v, np.ndarray) else torch.tensor([v])
         for k, v in item.items()}
pred = model(batch)
R = pred["pred_mano_params"]["global_orient"][0, 0]
out["wilor_keypoints_rotated"] = bool(torch.allclose(pred["pred_keypoints_3d"][0], CANONICAL_JOINTS @ R.T, atol=1e-6))
out["wilor_angle"] = float(torch.atan2(R[1, 0], R[0, 0]))
narrow = dict(batch, img=torch.zeros(1, 3, 256, 192))
out["wilor_narrow_crop"] = error(lambda: model(narrow))

# --- ultralytics (WiLoR's detector) ---
from ultralytics import YOLO
yolo = YOLO(str(base / "WiLoR" / "pretrained_models" / "detector.pt"))
images = [np.full((48, 64, 3), v, np.uint8) for v in (10, 90, 200)]
alone = [yolo(im, conf=0.3)[0].boxes.data.tolist() for im in images]
together = [r.boxes.data.tolist() for r in yolo(images[::-1], conf=0.3)][::-1]
out["yolo_per_image"] = alone == together and len({json.dumps(a) for a in alone}) == 3
out["yolo_batches"] = yolo.batch_sizes

# --- TAPIP3D (checkout stand-in) ---
os.chdir(base / "TAPIP3D")
sys.path.insert(0, str(base / "TAPIP3D"))
import importlib.util
spec = importlib.util.spec_from_file_location("tap_utils", base / "TAPIP3D" / "utils" / "inference_utils.py")
tap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tap)
(base / "placeholder.pth").write_bytes(b"placeholder")
out["tapip3d_placeholder"] = error(lambda: tap.load_model(str(base / "placeholder.pth")))
calls = []
hub_load = torch.hub.load
torch.hub.load = lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(RuntimeError("no network"))
ck = torch.load(base / "TAPIP3D" / "checkpoints" / "tapip3d_final.pth", weights_only=False)
ck["cfg"]["model"]["encoder"]["pretrained"] = True
torch.save(ck, base / "pretrained.pth")
out["tapip3d_pretrained"] = error(lambda: tap.load_model(str(base / "pretrained.pth")))
out["tapip3d_hub_calls"] = [list(c) for c in calls]
torch.hub.load = hub_load
m = tap.load_model(str(base / "TAPIP3D" / "checkpoints" / "tapip3d_final.pth"))
T, H, W = 3, 24, 32
args = dict(model=m, video=torch.zeros(T, 3, H, W), intrinsics=torch.eye(3).repeat(T, 1, 1),
            extrinsics=torch.eye(4).repeat(T, 1, 1), query_point=torch.zeros(2, 4), grid_size=0, bidrectional=False)
few = torch.zeros(T, H, W)
few[0, 0, :3] = 1.0
out["tapip3d_few_depths"] = error(lambda: tap.inference(depths=few, **args))
out["tapip3d_enough_depths"] = error(lambda: tap.inference(depths=torch.ones(T, H, W), **args))

# --- CoTracker3 ---
from cotracker.predictor import CoTrackerPredictor
(base / "cot.pth").write_bytes(b"x")
cot = CoTrackerPredictor(checkpoint=str(base / "cot.pth"))
small = torch.full((1, 8, 3, 192, 256), 0.5)  # half the model's size, values in [0, 1]
q = torch.tensor([[[0.0, 100.0, 50.0], [0.0, 20.0, 30.0]]])
out["cotracker_unit_range"] = error(lambda: cot(small, queries=q, backward_tracking=True))
tracks, vis = cot(small, queries=q, backward_tracking=True)
out["cotracker_model_queries"] = list(cot.model_queries.shape)
out["cotracker_tracks"] = tracks[0].tolist()
out["cotracker_visible"] = vis[0].tolist()

# --- transformers (GroundingDINO) ---
from transformers import AutoProcessor, AutoModelForZeroShotObjectDetection
frame = np.zeros((384, 512, 3), np.uint8)
frame[100:200, 300:420] = 220
proc = AutoProcessor.from_pretrained(str(base)); gd = AutoModelForZeroShotObjectDetection.from_pretrained(str(base))
inputs = proc(images=frame, text="block.", return_tensors="pt")
res = gd(**inputs)
for name, thr, size in (("gd_03", 0.3, (384, 512)), ("gd_095", 0.95, (384, 512)), ("gd_big", 0.3, (768, 1024)),
                        ("gd_001", 0.01, (384, 512))):
    r = proc.post_process_grounded_object_detection(res, inputs.input_ids, threshold=thr, target_sizes=[size])[0]
    out[name] = r["boxes"].tolist()

# --- SAM 3 ---
from PIL import Image
from sam3.model_builder import build_sam3_video_predictor
ckpt = str(base / "sam3" / "sam3.pt")
(base / "sam3" / "placeholder.pt").write_bytes(b"placeholder")
os.environ["FRAMEFLEET_STANDIN_SAM3_CPU"] = "0"
out["sam3_on_cpu"] = error(lambda: build_sam3_video_predictor(checkpoint_path=ckpt))
out["sam3_on_cpu_named"] = error(lambda: build_sam3_video_predictor(checkpoint_path=ckpt, gpus_to_use=[0]))
os.environ["FRAMEFLEET_STANDIN_SAM3_CPU"] = "1"
out["sam3_no_checkpoint"] = error(lambda: build_sam3_video_predictor())
placeholder = str(base / "sam3" / "placeholder.pt")
out["sam3_placeholder"] = error(lambda: build_sam3_video_predictor(checkpoint_path=placeholder))
pred = build_sam3_video_predictor(checkpoint_path=ckpt)
video = base / "sam3-frames"
video.mkdir()
for t in (0, 1, 2, 10):  # "10" after "2": in index order, not by name
    frame = np.zeros((48, 64, 3), np.uint8)
    frame[10:20, 5 * t:5 * t + 8] = 220
    Image.fromarray(frame).save(video / f"{t}.png")
sid = pred.handle_request({"type": "start_session", "resource_path": str(video)})["session_id"]
propagate = {"type": "propagate_in_video", "session_id": sid}
out["sam3_no_prompt"] = error(lambda: list(pred.handle_stream_request(propagate)))
first = pred.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": 2, "text": "block"})
out["sam3_prompt_frame"] = first["frame_index"]
out["sam3_prompt_mask"] = np.argwhere(first["outputs"]["out_binary_masks"][0]).min(axis=0).tolist()
stream = list(pred.handle_stream_request(
    {"type": "propagate_in_video", "session_id": sid, "propagation_direction": "both"}))
out["sam3_order"] = [r["frame_index"] for r in stream]
out["sam3_columns"] = [int(np.argwhere(r["outputs"]["out_binary_masks"][0])[:, 1].min()) for r in stream]
mug = pred.handle_request({"type": "add_prompt", "session_id": sid, "frame_index": 0, "text": "mug"})["outputs"]
out["sam3_mug"] = [len(mug["out_obj_ids"]), list(mug["out_binary_masks"].shape)]
pred.handle_request({"type": "reset_session", "session_id": sid})
out["sam3_after_reset"] = error(lambda: list(pred.handle_stream_request(propagate)))
out["sam3_close_twice"] = [pred.handle_request({"type": "close_session", "session_id": sid})["is_success"]
                           for _ in range(2)]

# --- hydra and ViPE ---
import hydra, vipe
from vipe.model_cache import VipeModelCache
with hydra.initialize_config_dir(config_dir=str(vipe.get_config_path()), version_base=None):
    out["hydra_lyra"] = hydra.compose("default", overrides=["pipeline=lyra"])["pipeline"]["slam"]["keyframe_depth"]
    out["hydra_unknown_pipeline"] = error(lambda: hydra.compose("default", overrides=["pipeline=lyraa"]))
    out["hydra_unknown_key"] = error(
        lambda: hydra.compose("default", overrides=["pipeline=lyra", "pipeline.slam.nope=1"]))
    out["hydra_append_existing"] = error(
        lambda: hydra.compose("default", overrides=["pipeline=lyra", "+pipeline.slam.keyframe_depth=moge"]))
    out["hydra_append_new"] = error(lambda: hydra.compose("default", overrides=["pipeline=lyra", "+pipeline.slam.x=1"]))
os.environ["FRAMEFLEET_STANDIN_VIPE_CPU"] = "0"
os.environ["TORCH_HOME"] = str(base / "vipe-cache" / "torch")
out["vipe_on_cpu"] = error(lambda: VipeModelCache.create(device=torch.device("cpu")))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    base = tmp_path_factory.mktemp("probe")
    lay_out_upstream(base)
    run = subprocess.run(
        [str(standin_python()), "-c", PROBE, str(base)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_wilor_crops_are_square_and_the_model_slices_them(probe):
    # vitdet_dataset.py:33/57: a square patch of MODEL.IMAGE_SIZE; wilor.py:111 slices [..., 32:-32].
    assert probe["wilor_crop"] == [3, 256, 256]
    assert "(3, 256, 256)" in probe["wilor_narrow_crop"]


def test_wilor_keypoints_come_rotated_by_the_global_orient(probe):
    # wilor.py:143-150: the keypoints are MANO's joints, which MANO rotated by the global orient.
    assert probe["wilor_keypoints_rotated"] is True and abs(probe["wilor_angle"]) > 0.1


def test_yolo_detects_each_image_alone_and_runs_a_list_as_one_batch(probe):
    # ultralytics 8.1.34: a list is one batch (data/loaders.py:428-433), a lone array a list of one
    # (loaders.py:406-407); letterbox, network, NMS and scaling give each image its own boxes
    # (engine/predictor.py:154-156, utils/ops.py:236, models/yolo/detect/predict.py:38-40).
    assert probe["yolo_per_image"] is True
    assert probe["yolo_batches"] == [1, 1, 1, 3]


def test_wilor_checkpoint_loads_as_pytorch_lightning_2_6_does(probe):
    # cloud_io.py:74-79 passes weights_only=None: torch >= 2.6 then refuses the pickled config.
    assert probe["wilor_plain_load"] is not None and "UnpicklingError" in probe["wilor_plain_load"]


def test_wilor_utils_needs_a_headless_platform(probe):
    assert (
        probe["wilor_import_without_platform"] is not None
        and "PYOPENGL_PLATFORM" in probe["wilor_import_without_platform"]
    )
    # pyrender/viewer.py:33-38: without a display, pyglet must be headless too (what failed on the GPU machine).
    assert (probe["wilor_import_with_egl_only"] or "").startswith("AttributeError")
    assert "XRenderFindVisualFormat" in probe["wilor_import_with_egl_only"]


def test_tapip3d_checks_its_checkpoint_and_the_depth_roi(probe):
    assert probe["tapip3d_placeholder"] is not None  # torch.load of placeholder bytes (models/__init__.py:33)
    # models/encoders/cotracker_cnn.py:24-25: a pretrained encoder goes to torch hub.
    assert probe["tapip3d_hub_calls"] == [["facebookresearch/co-tracker", "cotracker3_offline"]]
    # inference_utils.py:121-124: kthvalue of the positive depths at 25 %: three are too few.
    assert probe["tapip3d_few_depths"] is not None and "kthvalue" in probe["tapip3d_few_depths"]
    assert probe["tapip3d_enough_depths"] is None


def test_cotracker_resizes_adds_its_support_grid_and_takes_any_range(probe):
    assert probe["cotracker_unit_range"] is None  # no range check upstream
    assert probe["cotracker_model_queries"] == [1, 2 + 36, 3]  # the 6x6 support grid (predictor.py:147-155)
    tracks = np.array(probe["cotracker_tracks"])
    # The queries come back at their own frame; the model's (1.5, -0.5) px per step at 512x384 is
    # (1.5 * 255 / 511, -0.5 * 191 / 383) px per step at 256x192 (predictor.py:110-118 and 186-188).
    np.testing.assert_allclose(tracks[0], [[100, 50], [20, 30]], atol=1e-4)
    np.testing.assert_allclose(
        tracks[7] - tracks[0], 7 * np.array([[1.5 * 255 / 511, -0.5 * 191 / 383]] * 2), atol=1e-4
    )


def test_grounding_dino_post_processing_honours_threshold_and_size(probe):
    np.testing.assert_allclose(probe["gd_03"], [[300, 100, 420, 200]], atol=1e-3)
    assert probe["gd_095"] == []
    np.testing.assert_allclose(probe["gd_big"], [[600, 200, 840, 400]], atol=1e-3)
    assert len(probe["gd_001"]) == 4  # every query scores 0.1 or more


def test_hydra_rejects_what_hydra_rejects(probe):
    assert probe["hydra_lyra"] == "moge"
    assert "Could not find 'pipeline/lyraa'" in probe["hydra_unknown_pipeline"]
    assert "Could not override" in probe["hydra_unknown_key"]
    assert "already at" in probe["hydra_append_existing"]
    assert probe["hydra_append_new"] is None


def test_sam3_video_predictor_is_cuda_only_and_loads_its_checkpoint_as_upstream(probe):
    # sam3_video_predictor.py:293-313: the current CUDA device, or the named ones checked against the count.
    assert probe["sam3_on_cpu"] is not None and probe["sam3_on_cpu_named"] is not None
    # model_builder.py:774-784: no checkpoint means the Hugging Face hub; a checkpoint is a weights-only torch file.
    assert probe["sam3_no_checkpoint"] is not None and "Hugging Face" in probe["sam3_no_checkpoint"]
    assert probe["sam3_placeholder"] is not None


def test_sam3_request_api_behaves_as_upstream(probe):
    # sam3_video_inference.py:222-231: propagation needs a prompt, also after a reset.
    assert "No prompts" in probe["sam3_no_prompt"] and "No prompts" in probe["sam3_after_reset"]
    assert probe["sam3_prompt_frame"] == 2 and probe["sam3_prompt_mask"] == [10, 10]
    # sam3_video_predictor.py:204-221: forward from the prompted frame, then backward from the one before it;
    # io_utils.py:170-172: frames in index order (10 is the last).
    assert probe["sam3_order"] == [2, 3, 1, 0]
    assert probe["sam3_columns"] == [10, 50, 5, 0]
    assert probe["sam3_mug"] == [0, [0, 48, 64]]  # nothing found: no object, masks (0, H, W)
    assert probe["sam3_close_twice"] == [True, True]  # close_session is idempotent (lines 237-252)


def test_vipe_is_cuda_only(probe):
    assert probe["vipe_on_cpu"] is not None and "CUDA" in probe["vipe_on_cpu"]

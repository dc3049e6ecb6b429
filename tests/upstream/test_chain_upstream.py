"""A dataset through real workers with the masks stage on the real GroundingDINO + SAM 2 code (random weights).

The gpu worker runs our ``grounded_sam`` adapter from this venv with facebookresearch/sam2's
source on its path, as a worker runs from the environment ``deploy/envs/build.sh`` makes; the
other model stages are the synthetic ones. The run must finish, its masks must be SAM 2's
(T, H, W) bool masks or none, and the HDF5 file must verify.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.backends.real_clips import real_dir
from tests.conftest import run_script, settings_env
from tests.upstream.sources import run_python, source
from tests.upstream.test_grounded_sam_upstream import BUILD

pytestmark = [pytest.mark.upstream, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_dataset_with_real_grounded_sam_masks_verifies(pipeline_env, tmp_path):
    sam2 = source("facebookresearch+sam2")
    weights = tmp_path / "gsam"
    weights.mkdir()
    run_python(BUILD, str(weights), path=[sam2], env={"SAM2_BUILD_CUDA": "0"})
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(real_dir() / "dog.mp4", raw / "dog.mp4")  # 4 s: 11 frames at 2.5 fps
    settings = (
        "stages:\n"
        "  preprocess: {params: {target_fps: 2.5}}\n"
        "  masks:\n"
        "    enabled: true\n"
        "    backend: grounded_sam\n"
        f"    params: {{weights_dir: '{weights}', sam2_checkpoint: sam2.1_hiera_tiny.pt,\n"
        "             sam2_config: configs/sam2.1/sam2.1_hiera_t.yaml, box_threshold: 0.3,\n"
        "             text_prompt: red t-shaped block}\n"
        "  tracks: {params: {window_length: 5, grid_size: 64, mask_erosion_pixels: 2}}\n"
    )
    env = {k: v for k, v in pipeline_env.items() if k != "REDIS_URL"}
    env.update(settings_env(tmp_path, settings))
    env["PYTHONPATH"] = os.pathsep.join([str(sam2), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = tmp_path / "out"
    done = run_script("run_local.py", str(raw), "--out", str(out), "--cpu-workers", "1", env=env, timeout_s=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["done"] == 1, summary
    check = run_script("verify_dataset.py", str(out), env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    work = next((out / "work").iterdir())
    masks = np.load(work / "masks.npz")
    tracks = np.load(work / "tracks.npz")
    T = int(tracks["num_frames"])
    assert T >= 10 and masks["masks"].shape == (T, 384, 512) and masks["masks"].dtype == bool
    if bool(masks["found"]):
        assert (tracks["num_points"] <= 64).all()
    else:  # nothing found: y2r's grid
        assert not masks["masks"].any() and (tracks["num_points"] > 64 * 50).all()

"""y2r's behaviour when the masks model finds nothing: no mask, and the tracks stage queries TAPIP3D's grid."""

from __future__ import annotations

import numpy as np

from tasks.backends.convert_tracks import grid_on_mask
from tasks.job import Job
from tasks.outputs.geometry import project_uvd
from tasks.stages.depth import DepthStage
from tasks.stages.masks import MasksStage
from tasks.stages.tracks import TracksStage, grid_queries
from tests.stages.test_stage_models import textured


class NothingFound:
    """A masks backend that finds nothing, as grounded_sam does when no box passes the threshold."""

    peak_memory_bytes = 0
    chunk_scale = 1.0

    def segment(self, frames, prompt, progress=None):
        return None


def test_a_masks_backend_finding_nothing_gives_no_mask():
    stage = MasksStage()
    stage.model = NothingFound()
    frames = np.zeros((3, 24, 32, 3), np.uint8)
    out = stage.run({"frames": frames, "prompt": "mug"})
    assert out["found"] == np.bool_(False) and out["masks"].shape == (3, 24, 32) and not out["masks"].any()
    # The tracks stage then sees no masks at all; with masks found it sees them.
    outputs = {"preprocess": {"frames": frames}, "depth": {}, "masks": out}
    assert "masks" not in TracksStage.select_inputs(outputs, Job(run_id="r", video_id="v"))
    found = {"masks": np.ones((3, 24, 32), bool), "found": np.bool_(True)}
    assert "masks" in TracksStage.select_inputs({**outputs, "masks": found}, Job(run_id="r", video_id="v"))


def test_without_a_mask_the_tracks_stage_queries_y2rs_grid():
    frames = textured(12, 1)
    depth = DepthStage()
    depth.load("cpu")
    d = depth.run({"frames": frames})
    depths = d["depths"].copy()
    depths[:, :40] = 0  # the grid points of the top rows have no depth: TAPIP3D drops them
    stage = TracksStage(grid_size=64)
    stage.load("cpu")
    out = stage.run({"frames": frames, **d, "depths": depths})
    pixels, points = grid_queries(depths[0], d["intrinsics"][0], 64)
    grid = grid_on_mask(np.ones((384, 512), bool), 64)
    assert len(grid) == 64 * 64 and 64 * 50 < len(pixels) < 64 * 64
    assert out["num_points"].tolist() == [len(pixels)] * 3 and out["tracks"].shape[2] == len(pixels)
    # Step 0 of window 0 is the grid's points unprojected at their own (unrounded) pixels.
    uv = project_uvd(out["tracks"][0, 0], out["intrinsics"], 1.0)[:, :2]
    np.testing.assert_allclose(uv, pixels, atol=1e-2)
    np.testing.assert_allclose(out["tracks"][0, 0], points, rtol=1e-5, atol=1e-5)
    # With masks, the same stage draws target_points inside them, as before.
    masks = np.zeros((12, 384, 512), bool)
    masks[:, 100:300, 100:400] = True
    with_masks = stage.run({"frames": frames, **d, "depths": depths, "masks": masks})
    assert with_masks["tracks"].shape[2] == 64 and with_masks["num_points"].tolist() == [64] * 3

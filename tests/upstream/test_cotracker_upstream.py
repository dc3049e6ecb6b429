"""CoTracker3 through facebookresearch/co-tracker's own code: our ``cotracker`` adapter against y2r's call.

The model is ``CoTrackerThreeOffline`` built by upstream's ``build_cotracker`` (window 60, as
``hubconf.py`` builds ``cotracker3_offline``) with random weights, saved as the state dict the
hub's ``scaled_offline.pth`` is. Our adapter loads it by path on a real clip; y2r's call
(``thirdparty/cotracker3/tap.py:47-53``: a 64 grid on the eroded mask, backward tracking)
runs on the same weights and frames, and must give the same points and the same tracks.
"""

from __future__ import annotations

import pytest

from tests.upstream.sources import run_python, source

# About 2.5 CPU-minutes (4 CoTracker3 passes over 10 frames): make test-upstream, not make test.
pytestmark = [pytest.mark.upstream, pytest.mark.slow, pytest.mark.timeout(1800)]

SCRIPT = r"""
import json, sys, time
from pathlib import Path
import numpy as np
import torch

from cotracker.models.build_cotracker import build_cotracker
from cotracker.predictor import CoTrackerPredictor
from tasks.backends import get_backend
from tasks.backends.convert_tracks import erode, grid_on_mask
from tests.backends.real_clips import frames as real_frames

weights = Path(sys.argv[1])
torch.manual_seed(0)
t0 = time.monotonic()
model = build_cotracker(checkpoint=None, offline=True, window_len=60)
with torch.no_grad():
    # Random weights leave every step's visibility near sigmoid(0), so y2r would keep no point; a
    # visibility bias keeps them all, and the tracks of kept points can be compared.
    model.updateformer.vis_conf_head.bias.fill_(0.5)
torch.save(model.state_dict(), weights / "scaled_offline.pth")  # the hub file is a bare state dict

frames = np.array(real_frames("pstudio.mp4", 10, 3))  # y2r's window of 10 at 512x384
mask = np.zeros(frames.shape[1:3], bool)
mask[160:220, 220:290] = True
eroded = erode(mask, 2)  # y2r's mask_erosion_pixels
pixels = grid_on_mask(eroded, 64)

tracker = get_backend("tracks2d", "cotracker", weights_dir=str(weights))
tracker.load("cpu")
out = tracker.track2d(frames, pixels)

# y2r: tap.py on the same checkpoint, frames (1, T, C, H, W) in 0-255 and the eroded mask.
y2r = CoTrackerPredictor(checkpoint=str(weights / "scaled_offline.pth"), offline=True, window_len=60, v2=False)
video = torch.from_numpy(frames).permute(0, 3, 1, 2).float()[None]
with torch.no_grad():
    tracks, vis = y2r(video, grid_size=64, grid_query_frame=0,
                      segm_mask=torch.from_numpy(eroded).float()[None, None], backward_tracking=True)
keep = torch.all(vis > 0.95, dim=1)[0]
print(json.dumps({
    "pixels": pixels.tolist(),
    "tracks": np.nan_to_num(out["tracks"], nan=-1e9).tolist(),
    "tracks_dtype": str(out["tracks"].dtype), "visible_dtype": str(out["visible"].dtype),
    "visible": out["visible"].tolist(),
    "y2r_tracks": tracks[0].numpy().tolist(), "y2r_visible": vis[0].numpy().tolist(), "y2r_keep": keep.numpy().tolist(),
    "seconds": time.monotonic() - t0,
}))
"""


def test_cotracker_adapter_on_upstream_cotracker3_matches_y2r_call(tmp_path):
    import numpy as np

    res = run_python(SCRIPT, str(tmp_path), path=[source("facebookresearch+co-tracker")])
    pixels = np.array(res["pixels"])
    tracks = np.array(res["tracks"])
    tracks[tracks == -1e9] = np.nan
    visible = np.array(res["visible"])
    L, N = 10, len(pixels)
    assert N > 50
    assert tracks.shape == (L, N, 2) and res["tracks_dtype"] == "float32"
    assert visible.shape == (L, N) and res["visible_dtype"] == "bool"
    # y2r's grid on the same mask: the same points, in the same order.
    y2r_tracks, y2r_visible = np.array(res["y2r_tracks"]), np.array(res["y2r_visible"])
    assert y2r_tracks.shape == (L, N, 2)
    np.testing.assert_allclose(y2r_tracks[0], pixels, atol=1e-3)
    # The same visibility, and the same tracks for the points y2r keeps (visible > 0.95 at every step);
    # the others are NaN in ours (y2r drops them).
    np.testing.assert_array_equal(visible, y2r_visible)
    keep = np.array(res["y2r_keep"], bool)
    assert keep.any()
    np.testing.assert_array_equal(np.isfinite(tracks).all(axis=(0, 2)), keep)
    assert np.isnan(tracks[:, ~keep]).all()
    np.testing.assert_allclose(tracks[:, keep], y2r_tracks[:, keep], atol=1e-3)
    # Step 0 of a kept point is its query pixel (upstream overwrites the query-frame prediction).
    np.testing.assert_allclose(tracks[0, keep], pixels[keep], atol=1e-3)
    print(f"cotracker3 conformance: {N} points x {L} frames, {keep.sum()} kept, {res['seconds']:.1f} s")

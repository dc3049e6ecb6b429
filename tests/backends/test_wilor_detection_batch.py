"""The ``wilor`` backend gives its detector at most ``detection_batch`` frames a call, with the hands of one call.

It runs in the stand-ins' venv: the ultralytics stand-in answers per image, as ultralytics does
(its docstring cites the lines), and records how many images each call held.
"""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest

from tests.backends.standin_env import ROOT, lay_out_upstream, standin_python

SCRIPT = r"""
import json, sys
import numpy as np
from tasks.pipeline.oom import set_chunk_scale
from tasks.stages.hands import HandsStage

repo = sys.argv[1]
T = 45
rng = np.random.default_rng(7)
# Frames that differ (the stand-in's boxes follow each frame's bytes), a plane 1.5 m away.
frames = (rng.integers(0, 40, size=(T, 384, 512, 3)) + 4 * np.arange(T)[:, None, None, None]).astype(np.uint8)
inputs = {
    "frames": frames,
    "intrinsics": np.array([[400.0, 0, 256], [0, 400.0, 192], [0, 0, 1]], np.float32),
    "depths": np.full((T, 384, 512), 1.5, np.float32),
    "fps": 10.0,
}

def run(detection_batch=None, batch_size=7, chunk_scale=None):
    chunks = {} if detection_batch is None else {"detection_batch": detection_batch}  # None: the default
    # No velocity gate, no gap filling: the stage writes the backend's detections as they come.
    stage = HandsStage(
        backend="wilor", repo_dir=repo, batch_size=batch_size, max_hand_velocity=0, max_interpolation_gap=0, **chunks
    )
    stage.load("cpu")
    if chunk_scale is not None:
        set_chunk_scale(stage, chunk_scale)  # what the Oom hook does before a retried run
    wilor_calls = []  # the stage reports progress once per WiLoR batch
    out = stage.run(inputs, progress=lambda done, total: wilor_calls.append(done))
    arrays = {k: np.asarray(v).tolist() for k, v in out.items() if k != "quality"}
    return {"out": arrays, "detector_calls": stage.model._api["detector"].batch_sizes, "wilor_calls": len(wilor_calls)}

print(json.dumps({
    "one_call": run(detection_batch=1000),
    "default": run(),
    "by_7": run(detection_batch=7),
    "by_1": run(detection_batch=1),
    "after_ooms": run(detection_batch=16, chunk_scale=0.25),
    "after_many_ooms": run(detection_batch=16, chunk_scale=1 / 64),
}))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    dirs = lay_out_upstream(tmp_path_factory.mktemp("upstream"))
    done = subprocess.run(
        [str(standin_python()), "-c", SCRIPT, str(dirs["wilor"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_detection_in_chunks_gives_the_hands_of_one_call_and_each_call_holds_at_most_the_chunk(runs):
    one = runs["one_call"]
    assert one["detector_calls"] == [45]  # y2r's way: the whole video at once
    # The frames differ, and so do their hands: a left hand on some only, the right one moving.
    assert 0 < sum(one["out"]["left_valid"]) < 45 and all(one["out"]["right_valid"])
    assert len({tuple(np.ravel(p)) for p in one["out"]["right_wrist_pose"]}) == 45
    for name, calls in (("default", [32, 13]), ("by_7", [7] * 6 + [3]), ("by_1", [1] * 45)):
        assert runs[name]["detector_calls"] == calls, name
        assert runs[name]["out"].keys() == one["out"].keys()
        for key, value in one["out"].items():
            np.testing.assert_array_equal(np.array(runs[name]["out"][key]), np.array(value), err_msg=f"{name}: {key}")


def test_an_out_of_memory_retry_shrinks_the_detectors_and_wilors_calls(runs):
    # Chunk scale 1/4: 16 frames become 4 a detector call, and WiLoR's batches of 7 crops become 1.
    assert runs["after_ooms"]["detector_calls"] == [4] * 11 + [1]
    crops = runs["after_ooms"]["wilor_calls"]
    assert crops > 45 and runs["one_call"]["wilor_calls"] == math.ceil(crops / 7)
    # However many retries, at least one frame a call.
    assert runs["after_many_ooms"]["detector_calls"] == [1] * 45
    for name in ("after_ooms", "after_many_ooms"):
        for key, value in runs["one_call"]["out"].items():
            np.testing.assert_array_equal(np.array(runs[name]["out"][key]), np.array(value), err_msg=f"{name}: {key}")

"""The default gates on real footage with the real CPU backends and no config: a featureless still wall and a
1-frame video are kept out of the dataset with their reasons, the real clips are done."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np

from tests.backends.real_clips import real_dir
from tests.conftest import ONE_WORKER_EACH, run_script
from tests.test_real_chain import cut


def still(path: Path, frames: list[np.ndarray], fps: int = 10) -> None:
    """Write ``frames`` (H, W, 3) uint8 as an H.264 video at ``fps``."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def test_a_still_wall_and_a_one_frame_video_are_kept_out_with_their_reasons_and_real_clips_are_done(
    pipeline_env, tmp_path
):
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    cut(real_dir() / "sheep.mp4", raw / "sheep.mp4", 16)  # 16 frames: 7 windows of 10
    cut(real_dir() / "dog.mp4", raw / "dog.mp4", 45)  # 29.97 fps: 15 frames at 10 fps, the clip tracked worst
    still(raw / "wall.mp4", [np.full((384, 512, 3), 128, np.uint8)] * 20)
    still(raw / "one.mp4", [np.random.default_rng(0).integers(0, 255, (384, 512, 3), dtype=np.uint8)])
    # No config and the real default backends (the suite sets synthetic ones), as a new user runs it.
    env = {
        k: v
        for k, v in pipeline_env.items()
        if k not in ("REDIS_URL", "FRAMEFLEET_CONFIG", "FRAMEFLEET_DEFAULT_BACKENDS")
    }
    done = run_script("run_local.py", str(raw), "--out", str(out), *ONE_WORKER_EACH, env=env, timeout_s=280)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # 1: some videos kept out

    summary = json.loads((out / "run_summary.json").read_text())
    assert sorted(v.split("-")[0] for v in summary["done_videos"]) == ["dog", "sheep"], summary
    assert summary["statistics_videos"] == 2, summary
    (wall,) = summary["low_quality"]
    assert wall.startswith("wall"), summary["low_quality"]
    gates = {s["setting"] for s in summary["low_quality"][wall]}
    assert gates == {"min_track_visible_fraction", "min_median_track_length"}, summary["low_quality"]
    failed = {f["video"]: f for f in summary["failed"]}
    one = failed["one.mp4"]
    assert one["error_class"] == "BadInput" and one["stage"] == "preprocess", one
    assert "too short for the chain: 1 frame(s)" in one["reason"] and "window_length: 10" in one["reason"]
    assert summary["gates_caught"] == {
        "quality.min_median_track_length": 1,
        "quality.min_track_visible_fraction": 1,
        "too short (bad_input)": 1,
    }
    assert sorted(p.stem for p in out.glob("*.hdf5")) == sorted(v for v in summary["done_videos"])
    quarantined = [json.loads(line)["video"] for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(quarantined) == ["one.mp4", "wall.mp4"]
    assert "quality.min_track_visible_fraction: 1 video" in (out / "report.html").read_text()

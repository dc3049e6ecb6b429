"""The whole chain on real footage with the real CPU backends (configs/real-cpu.yaml): a dataset that verifies."""

from __future__ import annotations

import json
from pathlib import Path

import h5py

from tests.backends.real_clips import REPO, real_dir
from tests.conftest import ONE_WORKER_EACH, run_script


def cut(src: Path, dst: Path, frames: int) -> None:
    """Write the first ``frames`` frames of ``src`` to ``dst`` as H.264 at the source's frame rate."""
    import av

    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        video = inp.streams.video[0]
        stream = out.add_stream("libx264", rate=video.average_rate)
        stream.width, stream.height, stream.pix_fmt = video.width, video.height, "yuv420p"
        for i, frame in enumerate(inp.decode(video=0)):
            if i == frames:
                break
            for packet in stream.encode(frame.reformat(format="yuv420p")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def test_pstudio_through_the_real_backends_gives_a_dataset_that_verifies(pipeline_env, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    cut(real_dir() / "pstudio.mp4", raw / "pstudio.mp4", 16)  # 16 frames: 7 windows of 10
    out = tmp_path / "out"
    env = {k: v for k, v in pipeline_env.items() if k != "REDIS_URL"}
    done = run_script(
        "run_local.py",
        str(raw),
        "--out",
        str(out),
        "--config",
        str(REPO / "configs" / "real-cpu.yaml"),
        *ONE_WORKER_EACH,
        env=env,
        timeout_s=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checked = run_script("verify_dataset.py", str(out), env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    summary = json.loads((out / "run_summary.json").read_text())
    (vid,) = summary["done_videos"]
    notes = summary["notes"][vid]
    assert notes["hands"]["hands_backend"] == "mediapipe" and notes["depth"]["depth_backend"] == "classical"
    camera = notes["depth"]
    assert camera["camera"] == "fallback" and "barely moves" in camera["reason"]  # a camera on a tripod
    with h5py.File(out / f"{vid}.hdf5") as f:
        assert int(f["root/num_frames"][()]) == 16 and str(f["root/track_type"][()].decode()) == "3d"
        windows = sorted(f["root/tracks"])
        assert len(windows) == 7
        assert sum(f[f"root/tracks/{w}/query_coords"].shape[0] for w in windows) > 0
        # The near person's raised hand is in view on the first frames.
        assert any(k.endswith("_wrist_query_uvd") for k in f[f"root/tracks/{windows[0]}"])
    made = run_script("preview.py", str(out), env=env)
    assert made.returncode == 0 and (out / f"{vid}.preview.png").is_file(), made.stderr

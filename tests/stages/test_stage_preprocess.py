"""Preprocess on real H.264 files encoded here with PyAV, and on broken ones."""

from __future__ import annotations

import math
from pathlib import Path

import av
import numpy as np
import pytest

from tasks.errors import BadInput
from tasks.stages.preprocess import PreprocessStage


def encode(path: Path, n: int, fps: int, w: int = 640, h: int = 360, faststart: bool = False) -> Path:
    """Write an n-frame libx264 mp4 whose frame i is grey level 5 * i (so kept frames can be identified)."""
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            img = np.full((h, w, 3), (5 * i) % 256, np.uint8)
            c.mux(s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        c.mux(s.encode())
    return path


def kept_indices(n: int, source_fps: float, target_fps: float) -> list[int]:
    """The contract's rule in closed form: frame ceil(k * interval) for k = 0, 1, ..."""
    interval = source_fps / target_fps if source_fps > target_fps else 1.0
    return sorted({math.ceil(k * interval) for k in range(n + 1)} & set(range(n)))


def grey_levels(frames: np.ndarray) -> list[int]:
    return [int(round(float(f.mean()) / 5)) for f in frames]


@pytest.mark.parametrize(
    ("n", "fps", "size"),
    [(45, 30, (640, 360)), (30, 25, (640, 360)), (12, 8, (320, 240)), (20, 30, (384, 512))],
)
def test_resamples_scales_and_crops(tmp_path: Path, n: int, fps: int, size: tuple[int, int]) -> None:
    path = encode(tmp_path / "clip.mp4", n, fps, *size)
    out = PreprocessStage().run({"video_path": str(path)})
    expected = kept_indices(n, fps, 10.0)
    assert out["frames"].shape == (len(expected), 384, 512, 3) and out["frames"].dtype == np.uint8
    assert grey_levels(out["frames"]) == expected
    assert out["source_fps"] == pytest.approx(fps)
    assert out["fps"] == pytest.approx(min(10.0, fps))
    assert (out["source_width"], out["source_height"]) == size


def test_30fps_640x360_keeps_every_third_frame(tmp_path: Path) -> None:
    out = PreprocessStage().run({"video_path": str(encode(tmp_path / "a.mp4", 45, 30))})
    assert grey_levels(out["frames"]) == list(range(0, 45, 3))


def test_scale_is_max_ratio_then_centre_crop(tmp_path: Path) -> None:
    # 640x360 scales by 384/360 to 682x384; the crop keeps x in [85, 597) of that.
    path = tmp_path / "bars.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 640, 360, "yuv444p"
        img = np.zeros((360, 640, 3), np.uint8)
        img[:, 320:] = 255  # right half white
        c.mux(s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        c.mux(s.encode())
    frame = PreprocessStage().run({"video_path": str(path)})["frames"][0].mean(axis=(0, 2))
    edge = int(np.argmax(frame > 127))  # first column more white than black
    assert abs(edge - (341 - 85)) <= 1


def test_progress_is_reported(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    PreprocessStage().run(
        {"video_path": str(encode(tmp_path / "a.mp4", 90, 30))}, progress=lambda d, t: calls.append((d, t))
    )
    assert calls[-1] == (30, 30) and all(d <= t for d, t in calls)


def test_truncated_file_keeps_what_decodes(tmp_path: Path) -> None:
    data = encode(tmp_path / "full.mp4", 45, 30, faststart=True).read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 6 // 10])
    out = PreprocessStage().run({"video_path": str(cut)})
    assert 0 < len(out["frames"]) < 15
    # The last frame may be cut through; the ones before it are whole.
    assert grey_levels(out["frames"][:-1]) == list(range(0, 45, 3))[: len(out["frames"]) - 1]


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("empty.mp4", b"", "not a readable video"),
        ("notes.mp4", b"this is a text file, not a video\n" * 20, "not a readable video"),
        ("missing.mp4", None, "no such file"),
    ],
)
def test_unusable_inputs_raise_bad_input_naming_the_file(tmp_path: Path, name, content, problem) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(BadInput, match=problem) as info:
        PreprocessStage().run({"video_path": str(path)})
    assert str(path) in str(info.value)


def test_truncated_without_index_raises_bad_input(tmp_path: Path) -> None:
    data = encode(tmp_path / "full.mp4", 45, 30).read_bytes()  # moov atom at the end
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput, match=str(cut)):
        PreprocessStage().run({"video_path": str(cut)})


def test_audio_only_file_has_no_video_stream(tmp_path: Path) -> None:
    path = tmp_path / "sound.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        c.mux(s.encode(frame))
        c.mux(s.encode())
    with pytest.raises(BadInput, match="no video stream"):
        PreprocessStage().run({"video_path": str(path)})

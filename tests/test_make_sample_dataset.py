"""The sample-dataset maker writes real, varied, decodable videos, and corrupt inputs that are what they claim."""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from tasks.cli.sample import (
    FRAME_RATES,
    RESOLUTIONS,
    main,
    make_corrupt_inputs,
    make_video,
)

ROOT = Path(__file__).resolve().parent.parent
SECONDS = (1.0, 2.0)


def probe(path: Path) -> dict:
    """Decode every frame of ``path``: size, rate, codec, frame count, first frame and luma statistics."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="gray").astype(np.float32) for frame in container.decode(stream)]
        return {
            "size": (stream.codec_context.width, stream.codec_context.height),
            "fps": float(stream.average_rate),
            "codec": stream.codec_context.name,
            "pix_fmt": stream.codec_context.pix_fmt,
            "frames": len(frames),
            "coarse_luma_std": [float(_block_means(f).std()) for f in frames],
            "step": [float(np.abs(b - a).mean()) for a, b in itertools.pairwise(frames)],
            "thumb": _block_means(frames[0]),
        }


def _block_means(luma: np.ndarray, rows: int = 9, cols: int = 16) -> np.ndarray:
    """Average (H, W) luma over a rows x cols grid: frames of any size compare, and pixel noise drops out."""
    height, width = luma.shape[0] // rows * rows, luma.shape[1] // cols * cols
    blocks = luma[:height, :width].reshape(rows, height // rows, cols, width // cols)
    return blocks.mean(axis=(1, 3))


def decoded_frames(path: Path) -> int | None:
    """Frames decodable from ``path``, or None when FFmpeg refuses the file."""
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return None
            return sum(1 for _ in container.decode(video=0))
    except av.FFmpegError:
        return None


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    out = tmp_path_factory.mktemp("sample")
    assert main([str(out), "--videos", "6", "--seed", "3", "--seconds", f"{SECONDS[0]}-{SECONDS[1]}"]) == 0
    return out, {p.name: probe(p) for p in sorted(out.iterdir())}


def test_writes_the_requested_number_of_h264_videos(sample):
    _, videos = sample
    assert sorted(videos) == [f"video_{i:03d}.mp4" for i in range(6)]
    for name, info in videos.items():
        assert (info["codec"], info["pix_fmt"]) == ("h264", "yuv420p"), name


def test_resolutions_and_frame_rates_vary(sample):
    _, videos = sample
    sizes = {info["size"] for info in videos.values()}
    rates = {info["fps"] for info in videos.values()}
    assert sizes <= set(RESOLUTIONS) and len(sizes) >= 3, sizes
    assert rates <= set(map(float, FRAME_RATES)) and len(rates) >= 3, rates


def test_durations_stay_in_the_requested_range(sample):
    _, videos = sample
    for name, info in videos.items():
        seconds = info["frames"] / info["fps"]
        assert SECONDS[0] <= seconds <= SECONDS[1], (name, info["frames"], info["fps"])


def test_every_video_shows_different_content(sample):
    _, videos = sample
    for (a, info_a), (b, info_b) in itertools.combinations(videos.items(), 2):
        difference = np.abs(info_a["thumb"] - info_b["thumb"]).mean()
        assert difference > 5, f"{a} and {b} look alike (mean block difference {difference:.1f})"


def test_frames_move_smoothly_and_keep_large_brightness_variation(sample):
    # The synthetic depth is 2.4 - 2.0 * blurred luminance (m) and a frame whose depth std is
    # under 0.1 m is flat: that needs a large-scale luma std above 0.05 * 255 = 13 grey levels.
    _, videos = sample
    for name, info in videos.items():
        assert min(info["coarse_luma_std"]) > 20, (name, min(info["coarse_luma_std"]))
        assert min(info["step"]) > 0.1, f"{name} has two identical consecutive frames"
        assert max(info["step"]) < 30, f"{name} jumps between frames ({max(info['step']):.1f} mean grey levels)"


def test_the_default_point_tracker_follows_every_sample_video_through_whole_windows(sample):
    """`framefleet sample` then `framefleet run` keeps every video: the tracks gate (median track length) passes
    when the opencv tracker follows the points. Shapes once crossed the frame too fast for it: most points were
    lost within a frame or two (median 1 to 4 of a 10-frame window), and the gate kept a video out now and then."""
    from tasks.backends.point_tracks import to_gray, track_pixels
    from tasks.stages.preprocess import PreprocessStage
    from tasks.stages.tracks import DEFAULT_WINDOW_LENGTH as L

    out, videos = sample
    grid = np.stack(np.meshgrid(np.linspace(32, 480, 8), np.linspace(24, 360, 8)), axis=-1).reshape(-1, 2)
    for name in videos:
        gray = to_gray(PreprocessStage().run({"video_path": str(out / name)})["frames"])  # 10 fps, 512x384
        lengths = [
            track_pixels(gray[s : s + L], grid.astype(np.float32))[1].cumprod(axis=0).sum(axis=0)
            for s in range(0, len(gray) - L + 1, 3)
        ]
        assert lengths, (name, len(gray))
        median = float(np.median(np.concatenate(lengths)))
        assert median > L // 2, f"{name}: points followed {median} of {L} frames (median)"


def test_same_seed_same_bytes_other_seed_other_video(tmp_path):
    # 854 wide, not a multiple of 16: the case where libx264 once gave different bytes per run.
    first = make_video(tmp_path / "a.mp4", 854, 480, 24, 1.0, seed=11)
    again = make_video(tmp_path / "b.mp4", 854, 480, 24, 1.0, seed=11)
    other = make_video(tmp_path / "c.mp4", 854, 480, 24, 1.0, seed=12)
    digest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (first, again, other)}
    assert digest["a.mp4"] == digest["b.mp4"]
    assert digest["a.mp4"] != digest["c.mp4"]
    assert decoded_frames(first) == 24


def test_videos_encoded_side_by_side_are_the_ones_encoded_one_by_one(tmp_path):
    # --jobs only changes how many are encoded at once: a dataset made on a 64-core machine is the same
    # dataset as on a laptop, video for video.
    for jobs in ("1", "3"):
        assert main([str(tmp_path / jobs), "--videos", "3", "--seed", "5", "--seconds", "0.5-1", "--jobs", jobs]) == 0
    one, many = (sorted((tmp_path / jobs).glob("*.mp4")) for jobs in ("1", "3"))
    assert [p.name for p in one] == [p.name for p in many] == ["video_000.mp4", "video_001.mp4", "video_002.mp4"]
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in many]


def test_make_video_refuses_odd_sizes_and_empty_videos(tmp_path):
    with pytest.raises(ValueError, match="even"):
        make_video(tmp_path / "odd.mp4", 641, 360, 24, 1.0, seed=0)
    with pytest.raises(ValueError, match="at least one frame"):
        make_video(tmp_path / "none.mp4", 640, 360, 24, 0.01, seed=0)


def test_corrupt_inputs_are_what_they_claim(tmp_path):
    inputs = make_corrupt_inputs(tmp_path)
    assert set(inputs) == {"truncated", "empty", "not_video", "zero_frames"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in inputs.values())

    intact = make_video(tmp_path.parent / "intact.mp4", 320, 240, 15, 1.0, seed=7)
    truncated = inputs["truncated"]
    assert truncated.read_bytes() == intact.read_bytes()[: int(intact.stat().st_size * 0.4)]
    frames = decoded_frames(truncated)
    assert frames is None or frames < 15, frames

    assert inputs["empty"].name == "empty.mp4" and inputs["empty"].stat().st_size == 0
    assert decoded_frames(inputs["empty"]) is None

    assert inputs["not_video"].name == "notes.mp4"
    text = inputs["not_video"].read_bytes()
    assert text and text.decode("ascii").strip(), "notes.mp4 should hold plain text"
    assert decoded_frames(inputs["not_video"]) is None

    with av.open(str(inputs["zero_frames"])) as container:
        assert len(container.streams.video) == 1
        assert sum(1 for _ in container.decode(video=0)) == 0


def test_command_line_runs_from_the_repository_root(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "scripts/make_sample_dataset.py",
            str(tmp_path / "out"),
            "--videos",
            "2",
            "--seconds",
            "0.5-1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("[1/2] video_000.mp4") and lines[1].startswith("[2/2] video_001.mp4")
    assert str((tmp_path / "out").resolve()) in lines[-1]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["video_000.mp4", "video_001.mp4"]


@pytest.mark.parametrize("seconds", ["3", "4-2", "0-1", "a-b"])
def test_command_line_refuses_a_bad_seconds_range(tmp_path, seconds, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path), "--videos", "1", "--seconds", seconds])
    assert stopped.value.code == 2
    assert "--seconds" in capsys.readouterr().err

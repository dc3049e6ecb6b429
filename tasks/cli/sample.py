"""Write a folder of small, real, encoded videos to run framefleet on.

Usage: framefleet sample OUT_DIR --videos N [--seed S]
       [--seconds A-B] [--codec h264] [--jobs J]

Each video is H.264 in MP4 (yuv420p), a few seconds long, with its own
resolution, frame rate and content: a sweeping brightness gradient, slowly
moving shapes and a drifting noise texture, all drawn from a per-video seed. The
gradient keeps large-scale luminance variation in every frame, so the
synthetic depth backend (depth from luminance) never sees a flat frame; the
texture and the shapes' pace let the default point tracker follow it, so the
videos pass the default quality gates.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import av
import numpy as np

RESOLUTIONS = ((640, 360), (640, 480), (854, 480), (720, 540), (960, 540))
FRAME_RATES = (15, 24, 25, 30)
CODECS = {"h264": "libx264", "libx264": "libx264", "mpeg4": "mpeg4"}
NOISE_CELL_PX = 4


@dataclass(frozen=True)
class VideoSpec:
    """What one sample video will be: size in pixels, rate in frames/s, length in s."""

    width: int
    height: int
    fps: int
    seconds: float
    seed: int


def make_video(
    path: str | Path,
    width: int,
    height: int,
    fps: int,
    seconds: float,
    seed: int,
    codec: str = "libx264",
    slow_shapes: bool = False,
) -> Path:
    """Encode one synthetic video of round(seconds * fps) frames to ``path``.

    width, height: pixels, both even (yuv420p); fps: frames per second;
    seconds: duration; seed: picks the content, the same seed gives the same
    frames. slow_shapes: the shapes at a fifth of their pace (at most 0.19 of the frame a second, from the
    same draws), which the default point tracker follows; ``framefleet sample`` writes these. Raises
    ValueError for odd or non-positive sizes or an empty video.
    """
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise ValueError(f"width and height must be positive and even for yuv420p, got {width}x{height}")
    n_frames = round(seconds * fps)
    if n_frames < 1:
        raise ValueError(f"seconds * fps must give at least one frame, got {seconds} s at {fps} fps")
    path = Path(path)
    scene = _Scene(width, height, fps, n_frames / fps, np.random.default_rng(seed), slow_shapes)
    with av.open(str(path), "w") as container:
        stream: Any = container.add_stream(codec, rate=fps)
        stream.width = width
        stream.height = height
        stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            # mbtree off: with it, libx264 read uninitialised memory in its
            # lookahead and the same frames gave different files from run to run.
            stream.options = {"preset": "veryfast", "crf": "23", "x264-params": "mbtree=0"}
        for index in range(n_frames):
            container.mux(stream.encode(yuv420p_frame(scene.render(index))))
        container.mux(stream.encode(None))
    return path


# BT.601 limited range, what decoders assume for untagged SD video: rows Y, Cb, Cr.
_RGB_TO_YUV = (
    (65.481 / 255, 128.553 / 255, 24.966 / 255, 16.5),
    (-37.797 / 255, -74.203 / 255, 112.0 / 255, 128.5),
    (112.0 / 255, -93.786 / 255, -18.214 / 255, 128.5),
)


def yuv420p_frame(rgb: np.ndarray) -> av.VideoFrame:
    """Convert an (H, W, 3) uint8 RGB array, H and W even, to a yuv420p frame.

    Every byte of the frame is written, row padding included, so nothing
    uninitialised reaches the encoder.
    """
    height, width = rgb.shape[:2]
    rgb = rgb.astype(np.float32)
    # The conversion is linear, so averaging RGB over 2x2 blocks first gives the
    # averaged chroma at a quarter of the cost.
    small = rgb[0::2, 0::2] + rgb[1::2, 0::2]
    small += rgb[0::2, 1::2]
    small += rgb[1::2, 1::2]
    small *= np.float32(0.25)
    frame = av.VideoFrame(width, height, "yuv420p")
    for plane, source, coefficients in zip(frame.planes, (rgb, small, small), _RGB_TO_YUV, strict=True):
        r, g, b, offset = (np.float32(c) for c in coefficients)
        values = source[..., 0] * r
        values += source[..., 1] * g
        values += source[..., 2] * b
        values += offset
        np.clip(values, 0, 255, out=values)
        rows = np.frombuffer(memoryview(plane), dtype=np.uint8).reshape(-1, plane.line_size)
        rows[: plane.height, : plane.width] = values
        rows[: plane.height, plane.width :] = rows[: plane.height, plane.width - 1 : plane.width]
        rows[plane.height :] = 0
    return frame


class _Scene:
    """A seeded scene whose frames change smoothly with time."""

    def __init__(
        self,
        width: int,
        height: int,
        fps: int,
        seconds: float,
        rng: np.random.Generator,
        slow_shapes: bool = False,
    ) -> None:
        self.width, self.height, self.fps = width, height, fps
        ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
        scale = 2.0 / max(width, height)
        self.x = xs * scale - width * scale / 2
        self.y = ys * scale - height * scale / 2
        self.half_extent = (width * scale / 2, height * scale / 2)
        self.angle0 = rng.uniform(0, 2 * np.pi)
        self.angle_speed = rng.uniform(0.2, 0.6) * rng.choice((-1, 1))  # rad/s
        self.tint = rng.uniform(0.75, 1.0, size=3).astype(np.float32)
        self.low, self.high = rng.uniform(15, 45), rng.uniform(200, 240)
        # The texture drifts by whole pixels; it is drawn large enough for the
        # whole video so it never wraps (a wrap would be a jump in every pixel).
        self.noise_velocity = rng.uniform(-20, 20, size=2)  # (y, x) pixels/s
        travel = np.ceil(np.abs(self.noise_velocity) * seconds).astype(int) + 1
        self.noise_start = np.where(self.noise_velocity < 0, travel, 0)
        cells = (
            (height + travel[0]) // NOISE_CELL_PX + 1,
            (width + travel[1]) // NOISE_CELL_PX + 1,
        )
        cell_noise = rng.integers(-22, 23, size=cells).astype(np.float32)
        self.noise = cell_noise.repeat(NOISE_CELL_PX, axis=0).repeat(NOISE_CELL_PX, axis=1)
        self.shapes = [_Shape.random(rng, width, height, slow_shapes) for _ in range(rng.integers(3, 6))]

    def render(self, index: int) -> np.ndarray:
        """Return frame ``index`` as an (H, W, 3) uint8 RGB array."""
        t = index / self.fps
        angle = self.angle0 + self.angle_speed * t
        # Scaled so that, whatever the direction, the ramp runs from -1 to 1
        # corner to corner: the full brightness range is in every frame.
        cos, sin = np.cos(angle), np.sin(angle)
        reach = self.half_extent[0] * abs(cos) + self.half_extent[1] * abs(sin)
        ramp = self.x * np.float32(cos / reach)
        ramp += self.y * np.float32(sin / reach)
        span = np.float32((self.high - self.low) / 2)
        ramp *= span
        ramp += np.float32(self.low) + span
        image = ramp[..., None] * self.tint
        for shape in self.shapes:
            shape.draw(image, t)
        image += self._noise_at(t)[..., None]
        np.clip(image, 0, 255, out=image)
        return image.astype(np.uint8)

    def _noise_at(self, t: float) -> np.ndarray:
        oy, ox = (self.noise_start + self.noise_velocity * t).astype(int)
        return self.noise[oy : oy + self.height, ox : ox + self.width]


@dataclass(frozen=True)
class _Shape:
    """A filled disc or box moving on a Lissajous path."""

    kind: str
    size: float
    color: tuple[float, float, float]
    centre: tuple[float, float]
    amplitude: tuple[float, float]
    frequency: tuple[float, float]
    phase: tuple[float, float]

    @classmethod
    def random(cls, rng: np.random.Generator, width: int, height: int, slow: bool = False) -> _Shape:
        # Up to 2 pi x 0.5 Hz x 0.3 = 0.94 of the frame a second; slow: half the reach at 0.4 of the frequency,
        # 0.19. The opencv tracker loses most points around a fast shape within a frame, and the default gate
        # kept such a video out (median track length 1.0 < 1.5); slow ones it follows through whole windows.
        reach, rate = (0.5, 0.4) if slow else (1.0, 1.0)
        return cls(
            kind=str(rng.choice(("disc", "box"))),
            size=float(rng.uniform(0.06, 0.16) * min(width, height)),
            color=cast(tuple[float, float, float], tuple(float(c) for c in rng.uniform(0, 255, size=3))),
            centre=(
                float(rng.uniform(0.3, 0.7) * width),
                float(rng.uniform(0.3, 0.7) * height),
            ),
            amplitude=(
                float(rng.uniform(0.1, 0.3) * width * reach),
                float(rng.uniform(0.1, 0.3) * height * reach),
            ),
            frequency=cast(tuple[float, float], tuple(float(f) * rate for f in rng.uniform(0.1, 0.5, size=2))),
            phase=cast(tuple[float, float], tuple(float(p) for p in rng.uniform(0, 2 * np.pi, size=2))),
        )

    def draw(self, image: np.ndarray, t: float) -> None:
        height, width = image.shape[:2]
        cx = self.centre[0] + self.amplitude[0] * np.sin(2 * np.pi * self.frequency[0] * t + self.phase[0])
        cy = self.centre[1] + self.amplitude[1] * np.sin(2 * np.pi * self.frequency[1] * t + self.phase[1])
        r = self.size
        x0, x1 = max(int(cx - r), 0), min(int(cx + r) + 1, width)
        y0, y1 = max(int(cy - r), 0), min(int(cy + r) + 1, height)
        if x0 >= x1 or y0 >= y1:
            return
        if self.kind == "box":
            image[y0:y1, x0:x1] = self.color
            return
        ys, xs = np.ogrid[y0:y1, x0:x1]
        inside = (xs - cx) ** 2 + (ys - cy) ** 2 <= r * r
        image[y0:y1, x0:x1][inside] = self.color


def plan_videos(count: int, seed: int, seconds: tuple[float, float]) -> list[VideoSpec]:
    """Choose size, rate, duration and content seed of ``count`` videos from ``seed``.

    Consecutive videos cycle through the resolutions and frame rates from a
    seeded offset, so any two or more videos differ in both.
    """
    rng = np.random.default_rng(seed)
    res0, fps0 = rng.integers(len(RESOLUTIONS)), rng.integers(len(FRAME_RATES))
    specs = []
    for i in range(count):
        width, height = RESOLUTIONS[(res0 + i) % len(RESOLUTIONS)]
        fps = FRAME_RATES[(fps0 + i) % len(FRAME_RATES)]
        duration = float(rng.uniform(*seconds))
        # Whole frames only: keep round(duration * fps) / fps inside the range.
        n_frames = min(
            max(round(duration * fps), int(np.ceil(seconds[0] * fps))),
            int(seconds[1] * fps),
        )
        specs.append(VideoSpec(width, height, fps, n_frames / fps, int(rng.integers(2**31))))
    return specs


def make_corrupt_inputs(directory: str | Path) -> dict[str, Path]:
    """Write inputs that must fail as bad input; return them by kind.

    Kinds: ``truncated`` (a valid mp4 cut to 40 % of its bytes, index lost),
    ``empty`` (zero bytes), ``not_video`` (text named ``notes.mp4``) and
    ``zero_frames`` (an mp4 with a video stream and no frames).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # The intact video is made elsewhere so that no extra video ever sits in ``directory``.
    with tempfile.TemporaryDirectory() as scratch:
        data = make_video(Path(scratch) / "whole.mp4", 320, 240, 15, 1.0, seed=7).read_bytes()
    inputs = {
        "truncated": directory / "truncated.mp4",
        "empty": directory / "empty.mp4",
        "not_video": directory / "notes.mp4",
        "zero_frames": directory / "zero_frames.mp4",
    }
    inputs["truncated"].write_bytes(data[: int(len(data) * 0.4)])
    inputs["empty"].write_bytes(b"")
    inputs["not_video"].write_text("meeting notes: these are not the frames you are looking for\n")
    # empty_moov writes the track header up front; without it an mp4 with no
    # samples is read back with no video stream at all.
    with av.open(str(inputs["zero_frames"]), "w", options={"movflags": "empty_moov"}) as container:
        stream = container.add_stream("libx264", rate=15)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        container.start_encoding()
    return inputs


def _seconds_range(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seconds takes A-B, like 2-4; got {text!r}") from None
    if not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"--seconds needs 0 < A <= B; got {text!r}")
    return low, high


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--videos", type=int, required=True, help="how many videos to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=_seconds_range, default=(2.0, 4.0), help="duration range, A-B")
    parser.add_argument("--codec", choices=sorted(CODECS), default="h264")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(os.cpu_count() or 1, 16),
        help="videos encoded at once (default: the cores, up to 16)",
    )
    args = parser.parse_args(argv)
    if args.videos < 1:
        parser.error(f"--videos must be at least 1, got {args.videos}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    specs = plan_videos(args.videos, args.seed, args.seconds)
    paths = [args.out_dir / f"video_{i:03d}.mp4" for i in range(len(specs))]
    codec = CODECS[args.codec]
    started = time.monotonic()
    # Each video depends only on its spec, so encoding them side by side writes the same files.
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(specs))) as pool:
        done = pool.map(
            make_video,
            paths,
            *zip(*((s.width, s.height, s.fps, s.seconds, s.seed) for s in specs), strict=True),
            [codec] * len(specs),
            [True] * len(specs),  # slow shapes: every sample video passes the default gates
        )
        for i, (path, spec) in enumerate(zip(done, specs, strict=True)):
            print(
                f"[{i + 1}/{len(specs)}] {path.name} {spec.width}x{spec.height} {spec.fps} fps "
                f"{spec.seconds:.2f} s {round(spec.seconds * spec.fps)} frames",
                flush=True,
            )
    print(
        "these are drawn shapes, not footage: the real backends find no hands or scene in them. `make demo` "
        "runs them with FRAMEFLEET_DEFAULT_BACKENDS=synthetic (made-up outputs, for a demo of the machinery only)"
    )
    print(f"wrote {len(specs)} videos in {time.monotonic() - started:.1f} s to {args.out_dir.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

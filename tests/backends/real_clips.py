"""Where the real test clips are, and a few of their frames at the pipeline's 512x384."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def real_dir() -> Path:
    """Return the folder of the real clips: $FRAMEFLEET_REAL_DATA, else shared/data/real beside the repository."""
    candidates = [Path(os.environ["FRAMEFLEET_REAL_DATA"])] if os.environ.get("FRAMEFLEET_REAL_DATA") else []
    candidates += [parent / "shared" / "data" / "real" for parent in REPO.parents[:3]]
    for path in candidates:
        if (path / "pstudio.mp4").is_file():
            return path
    raise FileNotFoundError(
        f"the real test clips (pstudio.mp4, dog.mp4, sheep.mp4) are not in any of {[str(c) for c in candidates]}; "
        "set FRAMEFLEET_REAL_DATA to their folder"
    )


@cache
def _frames(name: str, count: int, step: int) -> np.ndarray:
    import av

    from tasks.stages.preprocess import PreprocessStage

    resize = PreprocessStage()._resize
    out = []
    with av.open(str(real_dir() / name)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i % step == 0:
                out.append(resize(frame.to_ndarray(format="rgb24")))
            if len(out) == count:
                break
    frames = np.stack(out)
    frames.setflags(write=False)
    return frames


def frames(name: str, count: int, step: int = 1) -> np.ndarray:
    """Return ``count`` frames (count, 384, 512, 3) uint8 RGB of clip ``name``, every ``step``-th from the start."""
    return _frames(name, count, step)

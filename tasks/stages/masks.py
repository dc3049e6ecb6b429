"""Masks (y2r's text-prompted GroundingDINO + SAM step): the manipulated object per frame, for choosing query points."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tasks.stages.base import ModelStage, Outputs, Progress, report, require


def erode(mask: np.ndarray, pixels: int) -> np.ndarray:
    """Return ``mask`` (H, W) bool eroded by a square of side 2 * ``pixels`` + 1 (outside the image counts as off)."""
    m = np.asarray(mask, dtype=bool)
    if pixels <= 0:
        return m.copy()
    k = 2 * pixels + 1
    padded = np.pad(m.astype(np.int32), pixels + 1)
    c = padded.cumsum(0).cumsum(1)
    window = c[k:, k:] - c[:-k, k:] - c[k:, :-k] + c[:-k, :-k]
    return window[: m.shape[0], : m.shape[1]] == k * k


class MasksStage(ModelStage):
    """Turn ``{"frames", "prompt"}`` into ``{"masks" (T, H, W) bool}`` at frame size.

    Off unless ``stages.masks.enabled``. The prompt is the video's ``noun`` from metadata.csv,
    else the ``text_prompt`` parameter; the ``none`` backend (the default) masks nothing out.
    """

    name = "masks"
    reads = ("preprocess",)
    optional = True
    default_backend = "none"

    def __init__(self, backend: str | None = None, text_prompt: str = "", **backend_params: Any) -> None:
        self.text_prompt = str(text_prompt)
        super().__init__(backend, **backend_params)

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Mapping[str, Any]) -> dict[str, Any]:
        return {"frames": outputs["preprocess"]["frames"], "prompt": str(job.get("noun") or "")}

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        frames = require(inputs, "frames", self.name, (None, None, None, 3), "u")
        prompt = str(inputs.get("prompt") or self.text_prompt)
        masks = np.asarray(self.model.segment(frames, prompt, progress=lambda d, t: report(progress, d, t)))
        if masks.shape != frames.shape[:3]:
            raise RuntimeError(
                f"masks backend {self.backend_name!r} returned masks {masks.shape}, wanted {frames.shape[:3]}"
            )
        return {"masks": masks.astype(bool)}

"""Masks (y2r's text-prompted GroundingDINO + SAM step): the manipulated object per frame, for choosing query points."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.backends.convert_tracks import erode
from tasks.job import Job
from tasks.stages.base import ModelStage, Outputs, Progress, report, require

__all__ = ["MasksStage", "erode"]


class MasksStage(ModelStage):
    """Turn ``{"frames", "prompt"}`` into ``{"masks" (T, H, W) bool, "found" bool}`` at frame size.

    ``found`` is False when the backend found no object (it returned None): the masks are then
    all False and the tracks stages query as if there were no masks (y2r saves no mask file).

    Off unless ``stages.masks.enabled``. The prompt is the ``text_prompt`` parameter when set (one
    prompt for every clip, as y2r's process_gsam.py:110-113 does), else the video's ``noun`` from
    metadata.csv; the ``none`` backend (the default) masks nothing out.
    """

    name = "masks"
    cpu_backend = "none"
    reads = ("preprocess",)
    optional = True
    default_backend = "none"

    def __init__(self, backend: str | None = None, text_prompt: str = "", **backend_params: Any) -> None:
        self.text_prompt = str(text_prompt)
        super().__init__(backend, **backend_params)

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        return {"frames": outputs["preprocess"]["frames"], "prompt": str(job.noun or "")}

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        frames = require(inputs, "frames", self.name, (None, None, None, 3), "u")
        prompt = self.text_prompt or str(inputs.get("prompt") or "")
        found = self.model.segment(frames, prompt, progress=lambda d, t: report(progress, d, t))
        if found is None:
            return {"masks": np.zeros(frames.shape[:3], dtype=bool), "found": np.bool_(False)}
        masks = np.asarray(found)
        if masks.shape != frames.shape[:3]:
            raise RuntimeError(
                f"masks backend {self.backend_name!r} returned masks {masks.shape}, wanted {frames.shape[:3]}"
            )
        return {"masks": masks.astype(bool), "found": np.bool_(True)}


def found_masks(outputs: Outputs) -> np.ndarray | None:
    """Return the masks stage's masks (T, H, W) from ``outputs``, or None when it did not run or found nothing."""
    if "masks" not in outputs:
        return None
    out = outputs["masks"]
    if "found" in out and not bool(np.asarray(out["found"])):
        return None
    return out["masks"]

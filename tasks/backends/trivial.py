"""Backends that need no model: the ``none`` masks (today's behaviour: every pixel may be a query)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.backends.base import MasksBackend, Progress, check_params


class AllTrueMasks(MasksBackend):
    """Masks nothing out: every pixel of every frame is on the object."""

    name = "none"

    def __init__(self, **unknown: Any) -> None:
        check_params(type(self), unknown, "none")
        super().__init__()

    def segment(self, frames: np.ndarray, prompt: str, progress: Progress | None = None) -> np.ndarray:
        if progress is not None:
            progress(len(frames), len(frames))
        return np.ones(np.asarray(frames).shape[:3], dtype=bool)

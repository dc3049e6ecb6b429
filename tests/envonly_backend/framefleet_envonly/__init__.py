"""A hands backend that exists only in its own environment: the synthetic hands, stamped with that environment."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from tasks.backends.synthetic import SyntheticHands


class EnvOnlyHands(SyntheticHands):
    """The synthetic hands; ``load`` records the interpreter prefix it runs in, so a test can see where it ran."""

    name = "envonly"

    def load(self, device: str) -> None:
        super().load(device)
        self.prefix = sys.prefix

    def detect(self, frames: np.ndarray, intrinsics: np.ndarray, depths: Any = None, progress: Any = None) -> Any:
        print(f"envonly hands ran in {self.prefix}", flush=True)
        return super().detect(frames, intrinsics, depths, progress)

"""The five pipeline stages as plain classes with ``load(device)`` and ``run(inputs, progress)``.

Stage modules are imported on first use, so importing this package loads neither
PyAV, h5py nor torch.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from tasks.errors import BadInput

Progress = Callable[[int, int], None]
log = logging.getLogger(__name__)

_CLASSES = {
    "preprocess": ("tasks.stages.preprocess", "PreprocessStage"),
    "depth": ("tasks.stages.depth", "DepthStage"),
    "tracks": ("tasks.stages.tracks", "TracksStage"),
    "hands": ("tasks.stages.hands", "HandsStage"),
    "h5": ("tasks.stages.h5", "H5Stage"),
}
STAGE_NAMES = tuple(_CLASSES)
__all__ = ["STAGE_NAMES", "stage_class", "require", "report", *(cls for _, cls in _CLASSES.values())]


class ModelStage:
    """What the three model stages share: a backend model built from its name, loaded on a device."""

    name = ""

    def __init__(self, backend: str = "synthetic", **backend_params: Any) -> None:
        from tasks.backends import get_backend

        self.backend_name = backend
        self.model = get_backend(self.name, backend, **backend_params)

    @property
    def peak_memory_bytes(self) -> int:
        return int(getattr(self.model, "peak_memory_bytes", 0))

    def load(self, device: str) -> None:
        self.model.load(device)


def stage_class(name: str) -> type:
    """Return the stage class named ``name`` (one of STAGE_NAMES); raises KeyError naming the choices."""
    if name not in _CLASSES:
        raise KeyError(f"unknown stage {name!r}; stages are {', '.join(STAGE_NAMES)}")
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(module), cls)


def __getattr__(attr: str) -> Any:
    for name, (_, cls) in _CLASSES.items():
        if cls == attr:
            return stage_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def require(
    inputs: dict[str, Any],
    key: str,
    stage: str,
    shape: tuple[int | None, ...] | None = None,
    kind: str | None = None,
) -> np.ndarray:
    """Return ``inputs[key]`` as an array; raises BadInput naming the key, the shape wanted and found.

    ``shape`` uses None for any length; ``kind`` is a NumPy dtype-kind string such as "f", "u" or "fiu".
    """
    if key not in inputs:
        raise BadInput(
            f"{stage}: input {key!r} is missing (got keys {sorted(inputs)}); pass the previous stage's output"
        )
    arr = np.asarray(inputs[key])
    if shape is not None:
        ok = arr.ndim == len(shape) and all(w is None or w == n for w, n in zip(shape, arr.shape, strict=True))
        if not ok:
            wanted = "(" + ", ".join("*" if w is None else str(w) for w in shape) + ")"
            raise BadInput(f"{stage}: input {key!r} must have shape {wanted}, got {arr.shape}")
    if kind is not None and arr.dtype.kind not in kind:
        raise BadInput(f"{stage}: input {key!r} must have a dtype of kind {kind!r}, got {arr.dtype}")
    return arr


def report(progress: Progress | None, done: int, total: int) -> None:
    """Call ``progress(done, total)`` if given; a failing callback must not fail the stage."""
    if progress is None:
        return
    try:
        progress(int(done), int(total))
    except Exception:  # progress is cosmetic: log it, keep the work
        log.warning("progress callback failed at %d/%d", done, total, exc_info=True)

"""Model backends in one registry keyed by (stage, name): built-in ones, then the ``framefleet.backends`` entry points.

A backend living in its own package (beside its heavy dependencies) registers itself with
an entry point in that package's ``pyproject.toml``::

    [project.entry-points."framefleet.backends"]
    "hands.mybackend" = "my_package.module:MyHandsBackend"

The name is ``<stage>.<backend>``; the value is the class. Nothing is imported until the
backend is built, so validating settings never pulls in torch or a model package.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from tasks.errors import UnknownBackend

ENTRY_POINT_GROUP = "framefleet.backends"

# (stage, backend name) -> "module:Class" of the backends that ship with framefleet.
BUILTIN: dict[tuple[str, str], str] = {
    ("depth", "synthetic"): "tasks.backends.synthetic:SyntheticDepth",
    ("tracks", "synthetic"): "tasks.backends.synthetic:SyntheticTracker",
    ("hands", "synthetic"): "tasks.backends.synthetic:SyntheticHands",
    ("tracks2d", "synthetic"): "tasks.backends.synthetic:SyntheticTracker2D",
    ("masks", "none"): "tasks.backends.trivial:AllTrueMasks",
    ("depth", "vipe"): "tasks.backends.vipe:VipeDepth",
    ("tracks", "tapip3d"): "tasks.backends.tapip3d:Tapip3dTracker",
    ("tracks2d", "cotracker"): "tasks.backends.cotracker:CoTrackerTracks2D",
    ("hands", "wilor"): "tasks.backends.wilor:WilorHands",
    ("masks", "grounded_sam"): "tasks.backends.grounded_sam:GroundedSamMasks",
    ("masks", "sam3"): "tasks.backends.sam3:Sam3Masks",
    # Real backends that run on a CPU (the `real` extra): see README, "Real backends".
    ("depth", "classical"): "tasks.backends.classical_depth:ClassicalDepth",
    ("tracks", "opencv"): "tasks.backends.opencv_tracks:OpenCVTracks",
    ("tracks2d", "opencv"): "tasks.backends.opencv_tracks:OpenCVTracks2D",
    ("hands", "mediapipe"): "tasks.backends.mediapipe_hands:MediaPipeHands",
}


@cache
def _entry_points() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        stage, _, name = ep.name.partition(".")
        if stage and name:
            found[(stage, name)] = ep.value
    return found


def registry() -> dict[tuple[str, str], str]:
    """Every known backend, (stage, name) -> "module:Class"; built-in names win over entry points."""
    return {**_entry_points(), **BUILTIN}


def available(stage: str) -> list[str]:
    """Return the backend names of ``stage`` (empty for a stage without a model)."""
    return sorted(name for s, name in registry() if s == stage)


def check_backend(stage: str, name: str) -> None:
    """Raise UnknownBackend, naming the choices, when ``name`` is not a backend of ``stage``."""
    if (stage, name) not in registry():
        choices = available(stage)
        raise UnknownBackend(
            f"unknown {stage} backend {name!r}; available: {', '.join(choices) or 'none'}. "
            f"Fix stages.{stage}.backend in the settings, or install the package that provides it "
            f"(an entry point '{stage}.{name}' in the group {ENTRY_POINT_GROUP!r})."
        )


def backend_class(stage: str, name: str) -> type:
    """Import and return the class of backend ``name`` of ``stage``; raises UnknownBackend."""
    check_backend(stage, name)
    module, _, cls = registry()[(stage, name)].partition(":")
    return getattr(importlib.import_module(module), cls)


def get_backend(stage: str, name: str, **params: Any) -> Any:
    """Return an unloaded backend ``name`` of ``stage`` built with ``params``; raises UnknownBackend."""
    return backend_class(stage, name)(**params)

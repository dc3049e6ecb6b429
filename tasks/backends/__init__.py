"""Model backends of the GPU stages, looked up by stage and name; ``synthetic`` is built in."""

from __future__ import annotations

import importlib
from typing import Any

from tasks.errors import UnknownBackend

# stage -> backend name -> "module:Class"; real adapters (vipe, tapip3d, wilor) register here.
BACKENDS: dict[str, dict[str, str]] = {
    "depth": {"synthetic": "tasks.backends.synthetic:SyntheticDepth"},
    "tracks": {"synthetic": "tasks.backends.synthetic:SyntheticTracker"},
    "hands": {"synthetic": "tasks.backends.synthetic:SyntheticHands"},
}


def available(stage: str) -> list[str]:
    """Return the backend names of ``stage`` (empty for a stage without a model)."""
    return sorted(BACKENDS.get(stage, {}))


def get_backend(stage: str, name: str, **params: Any) -> Any:
    """Return an unloaded backend ``name`` of ``stage`` built with ``params``; raises UnknownBackend."""
    if stage not in BACKENDS:
        raise UnknownBackend(
            f"stage {stage!r} has no model backends (asked for {name!r}); "
            f"stages with backends: {', '.join(sorted(BACKENDS))}"
        )
    if name not in BACKENDS[stage]:
        raise UnknownBackend(
            f"unknown {stage} backend {name!r}; available: {', '.join(available(stage))}. "
            "Fix the stage's backend setting."
        )
    module, _, cls = BACKENDS[stage][name].partition(":")
    return getattr(importlib.import_module(module), cls)(**params)

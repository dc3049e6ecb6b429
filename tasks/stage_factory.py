"""Build a stage object from its settings (the stage classes know nothing of settings)."""

from __future__ import annotations

import importlib
from typing import Any

from worker_config.settings import StageSettings

_CLASSES = {
    "preprocess": "tasks.stages.preprocess:PreprocessStage",
    "depth": "tasks.stages.depth:DepthStage",
    "tracks": "tasks.stages.tracks:TracksStage",
    "hands": "tasks.stages.hands:HandsStage",
    "h5": "tasks.stages.h5:H5Stage",
}


def build(name: str, conf: StageSettings) -> Any:
    """Return an unloaded stage ``name`` configured by ``conf``."""
    module, _, cls = _CLASSES[name].partition(":")
    stage_cls = getattr(importlib.import_module(module), cls)
    params: dict[str, Any] = dict(conf.params)
    if conf.backend != "builtin":
        params["backend"] = conf.backend
    return stage_cls(**params)

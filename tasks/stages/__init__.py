"""The pipeline's stages, declared once: this list, and what each class says of itself (tasks.stages.base).

Everything else derives from it: the Celery tasks (tasks.pipeline), the CPU/GPU split, the
settings' stage defaults and their validation (worker_config.settings), the inputs each stage
is given (tasks.outputs.stage_io) and the chain a video follows (``chain_order``). To add a stage,
write its class in a module of this package and add it to ``ALL``.
Importing this package loads neither PyAV, h5py nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.stages.base import ModelStage, Progress, Stage, report, require
from tasks.stages.depth import DepthStage
from tasks.stages.h5 import H5Stage
from tasks.stages.hands import HandsStage
from tasks.stages.masks import MasksStage
from tasks.stages.preprocess import PreprocessStage
from tasks.stages.tracks import TracksStage
from tasks.stages.tracks2d import Tracks2DStage

# In pipeline order; a stage comes after every stage it reads or uses.
ALL: tuple[type[Stage], ...] = (
    PreprocessStage,
    MasksStage,
    DepthStage,
    TracksStage,
    Tracks2DStage,
    HandsStage,
    H5Stage,
)
BY_NAME: dict[str, type[Stage]] = {cls.name: cls for cls in ALL}
STAGE_NAMES = tuple(BY_NAME)
GPU_STAGES = tuple(cls.name for cls in ALL if cls.device == "gpu")
CPU_STAGES = tuple(cls.name for cls in ALL if cls.device == "cpu")

__all__ = [
    "ALL",
    "CPU_STAGES",
    "GPU_STAGES",
    "STAGE_NAMES",
    "ModelStage",
    "Progress",
    "Stage",
    "build",
    "chain_order",
    "dataset_stage",
    "source_stage",
    "stage_class",
    "typed_params",
    "report",
    "require",
    *(cls.__name__ for cls in ALL),
]


def stage_class(name: str) -> type[Stage]:
    """Return the stage class named ``name``; raises KeyError naming the choices."""
    if name not in BY_NAME:
        raise KeyError(f"unknown stage {name!r}; stages are {', '.join(STAGE_NAMES)}")
    return BY_NAME[name]


def source_stage() -> type[Stage]:
    """The stage that reads the raw video (it reads no other stage)."""
    return next(cls for cls in ALL if not cls.reads)


def dataset_stage() -> type[Stage]:
    """The stage that writes a video's dataset file (the .hdf5)."""
    return next(cls for cls in ALL if cls.writes == "hdf5")


def chain_order(enabled: Mapping[str, Any]) -> tuple[str, ...]:
    """Return the enabled stages in the order a video runs them.

    ``enabled`` maps a stage name to something with an ``enabled`` attribute (the settings'
    stages) or a bool. Raises ValueError when an enabled stage reads one that is off.
    """

    def on(name: str) -> bool:
        value = enabled.get(name)
        if value is None:
            return not BY_NAME[name].optional
        return bool(getattr(value, "enabled", value))

    order = tuple(cls.name for cls in ALL if on(cls.name))
    for name in order:
        missing = [r for r in BY_NAME[name].reads if r not in order]
        if missing:
            raise ValueError(
                f"stage {name!r} reads {', '.join(missing)}, which is switched off; "
                f"set stages.{missing[0]}.enabled: true or switch {name} off"
            )
    return order


def _check_order() -> None:
    seen: set[str] = set()
    for cls in ALL:
        late = [r for r in (*cls.reads, *cls.uses) if r not in seen]
        if late:
            raise RuntimeError(f"stage {cls.name!r} reads {late} but comes before them in tasks.stages.ALL")
        seen.add(cls.name)


_check_order()


def typed_params(name: str, backend: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Stage ``name``'s ``params`` (with ``backend``) typed as its constructors want them; raises ValueError
    naming an unknown parameter and those that exist, or a mistyped value (tasks.stages.params)."""
    from tasks.stages import params as checked

    cls = stage_class(name)
    model = None
    if issubclass(cls, ModelStage):
        from tasks.backends import backend_class

        try:
            model = backend_class(name, backend)
        except ImportError:  # its package is not installed here: the names cannot be read, the worker checks
            return dict(params)
    return checked.check(name, backend, cls, model, dict(params))


def build(name: str, conf: Any) -> Stage:
    """Return an unloaded stage ``name`` configured by ``conf`` (its StageSettings: backend and params)."""
    cls = stage_class(name)
    params: dict[str, Any] = typed_params(name, conf.backend, conf.params)
    if issubclass(cls, ModelStage):
        params["backend"] = conf.backend
    return cls(**params)


def model_backends(conf: Any) -> dict[str, str]:
    """The backend of each enabled stage that has a model, by stage, from settings ``conf``."""
    return {
        name: conf.stages[name].backend for name in conf.enabled_stages() if issubclass(stage_class(name), ModelStage)
    }

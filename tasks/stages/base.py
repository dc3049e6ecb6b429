"""What a pipeline stage is: a plain class that declares its place in the pipeline and runs one video.

A stage has no Celery import. It declares, as class attributes, everything the rest of
framefleet derives from it (the Celery tasks, the CPU/GPU split, the settings' defaults and
validation, the inputs it is given and the chain a video follows):

- ``name``: the task is ``framefleet.<name>``, the settings key ``stages.<name>``;
- ``device``: "gpu" (a per-GPU queue, a model loaded once per worker) or "cpu" (the cpu queue);
- ``reads``: the earlier stages whose outputs it needs; ``uses``: optional stages whose
  outputs it takes when they are enabled (their absence is not an error);
- ``writes``: "npz" (an intermediate in OUT/work/<video>/) or "hdf5" (the dataset file);
- ``default_backend``: the backend when the settings name none ("builtin" for stages without a
  model; a model stage's default is its ``cpu_backend``, or y2r's model where its environment is
  found: tasks.backends.defaults); ``optional``: off unless ``stages.<name>.enabled`` is true;
- ``default_params`` and ``default_deadline_s``: the settings' defaults for the stage;
- ``gates``: the quality gates on the measures its ``run`` returns under "quality".

``select_inputs`` picks its ``run`` inputs out of the outputs of the stages it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from tasks.errors import BadInput, FramefleetError
from tasks.job import Job

Progress = Callable[[int, int], None]
# What ``run`` may return beside its arrays (JSON-able dicts, not saved in the npz): facts for the run
# summary, and the measured quality the gates read (tasks.pipeline.quality).
REPORT_KEYS = ("notes", "quality")
Outputs = Mapping[str, Mapping[str, Any]]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gate:
    """A quality gate on one of the stage's ``quality`` measures, its threshold the setting ``quality.<setting>``.

    ``kind``: "min" fails a value below the threshold, "max" one above it (None: off), "allow" fails
    the value ``bad`` when the setting is false.
    """

    measure: str
    setting: str
    kind: Literal["min", "max", "allow"]
    bad: Any = None


class Stage:
    """One pipeline stage: ``load(device)`` once per worker, then ``run(inputs, progress)`` per video."""

    name: ClassVar[str] = ""
    device: ClassVar[Literal["cpu", "gpu"]] = "cpu"
    reads: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[Literal["npz", "hdf5"]] = "npz"
    default_backend: ClassVar[str] = "builtin"
    optional: ClassVar[bool] = False
    default_params: ClassVar[dict[str, Any]] = {}
    default_deadline_s: ClassVar[float] = 3600.0
    gates: ClassVar[tuple[Gate, ...]] = ()  # on what ``run`` returns under "quality" (tasks.pipeline.quality)

    @classmethod
    def min_frames(cls, params: Mapping[str, Any]) -> int:
        """The fewest frames a video needs for this stage, set by ``params`` (its settings), to give it any output."""
        return 1

    def load(self, device: str) -> None:
        """Load what the stage needs on ``device``; stages without a model have nothing to load."""

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        """Return the inputs of ``run`` from ``outputs`` (stage name -> its arrays) and the job's fields."""
        raise NotImplementedError


class ModelStage(Stage):
    """A stage whose work is done by a model backend (tasks.backends), built from its name, loaded on a device."""

    device = "gpu"
    default_backend = ""  # chosen by tasks.backends.defaults: cpu_backend, or y2r's model where it is installed
    cpu_backend: ClassVar[str] = ""  # the real backend that runs on a CPU in the main environment

    def __init__(self, backend: str | None = None, **backend_params: Any) -> None:
        from tasks.backends import get_backend
        from tasks.backends.defaults import unnamed_backend

        self.backend_name = backend or self.default_backend or unnamed_backend(type(self))
        self.model = get_backend(self.name, self.backend_name, **backend_params)

    @property
    def peak_memory_bytes(self) -> int:
        return int(self.model.peak_memory_bytes)

    @property
    def chunk_scale(self) -> float:
        return float(self.model.chunk_scale)

    @chunk_scale.setter
    def chunk_scale(self, scale: float) -> None:
        self.model.chunk_scale = scale

    def load(self, device: str) -> None:
        self.model.load(device)


def require(
    inputs: Mapping[str, Any],
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
    """Call ``progress(done, total)`` if given; a failing callback must not fail the stage, but a
    FramefleetError it raises on purpose (the run was cancelled) stops it."""
    if progress is None:
        return
    try:
        progress(int(done), int(total))
    except FramefleetError:
        raise
    except Exception:  # progress is cosmetic: log it, keep the work
        log.warning("progress callback failed at %d/%d", done, total, exc_info=True)

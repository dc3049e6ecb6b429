"""A stage's parameters, checked and typed before any worker starts: the names the stage and its backend take, and
each value read as the type its keyword wants (an environment variable always arrives as text).

The names come from the constructors' signatures (the stage's, then its backend's), so the list a refusal
prints is the list the classes take; nothing is built and no model package is imported.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import yaml

_NOT_NAMES = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)


def accepted(stage_cls: type, backend_cls: type | None) -> dict[str, inspect.Parameter]:
    """The keyword parameters ``stage_cls`` takes, then those of ``backend_cls`` (its model), by name."""
    found: dict[str, inspect.Parameter] = {}
    for cls in (stage_cls, backend_cls):
        if cls is None:
            continue
        for name, param in inspect.signature(cls).parameters.items():  # its constructor's, without self
            if name not in ("self", "backend") and param.kind not in _NOT_NAMES:
                found.setdefault(name, param)
    return found


def _kind(param: inspect.Parameter) -> str | None:
    """The kind a value must be, "bool", "float" or "int", from the annotation or the default; None: as given."""
    note = param.annotation if isinstance(param.annotation, str) else getattr(param.annotation, "__name__", "")
    words = set(str(note).replace("|", " ").replace(",", " ").split())
    for kind in ("bool", "float", "int"):
        if kind in words:
            return kind
    default = param.default
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, (int, float)) and default is not inspect.Parameter.empty:
        return "float" if isinstance(default, float) else "int"
    return None


def _typed(value: Any, kind: str | None) -> Any:
    """``value`` as ``kind``; raises ValueError when it is not one. A value of the right type is returned as it
    is (an int for a float keyword stays an int: the run's settings hash is what it always was)."""
    if kind is None or value is None:
        return value
    if isinstance(value, str):  # from the environment (or quoted in YAML): read it as YAML reads a value
        with contextlib.suppress(yaml.YAMLError):  # not YAML: text, refused below
            value = yaml.safe_load(value)
        if isinstance(value, str) and kind in ("float", "int"):  # YAML 1.1 reads 1.0e12 (no sign) as text
            with contextlib.suppress(ValueError):
                value = float(value)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (kind == "bool" and isinstance(value, bool)) or (kind == "float" and number):
        return value
    if kind == "int" and number and float(value).is_integer():
        return int(value)
    raise ValueError({"bool": "true or false", "int": "a whole number", "float": "a number"}[kind])


def check(
    stage: str, backend: str, stage_cls: type, backend_cls: type | None, params: dict[str, Any]
) -> dict[str, Any]:
    """Return ``params`` with each value of the type its keyword wants; raises ValueError naming an unknown
    parameter and the ones that exist, or a value of the wrong type and the type wanted."""
    known = accepted(stage_cls, backend_cls)
    with_backend = f" with the {backend} backend" if backend_cls is not None else ""
    unknown = sorted(name for name in params if name not in known)
    if unknown:
        names = ", ".join(known) or "none"
        raise ValueError(
            f"stages.{stage}.params: unknown parameter{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))} for the {stage} stage{with_backend}; its parameters are: {names}"
        )
    typed = {}
    for name, value in params.items():
        kind = _kind(known[name])
        try:
            typed[name] = _typed(value, kind)
        except ValueError as exc:
            variable = f"FRAMEFLEET_STAGES__{stage.upper()}__PARAMS__{name.upper()}"
            raise ValueError(f"stages.{stage}.params.{name} (${variable}) must be {exc}, got {value!r}") from None
    return typed

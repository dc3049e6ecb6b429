"""Which backend each model stage runs when the settings name none, and what each backend is not.

``default_backends`` (a setting) picks them: ``auto`` (the default) runs y2r's model of a stage
where its environment is installed in the layout of ``configs/real-gpu.yaml`` (that file's
``stages.<stage>.python`` exists), else the stage's real CPU backend (``cpu_backend`` of its
class: classical depth, OpenCV tracks, MediaPipe hands); ``cpu`` always the CPU backends;
``synthetic`` the made-up stand-ins, for tests and demos only. Nothing here imports a model.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml

MODES = ("auto", "cpu", "synthetic")
MODE_ENV = "FRAMEFLEET_DEFAULT_BACKENDS"  # the environment variable of the setting default_backends
UPSTREAM_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "real-gpu.yaml"


def upstream_layout() -> dict[str, dict[str, Any]]:
    """The model stages of configs/real-gpu.yaml whose interpreter exists on this host: stage -> its settings."""
    return _installed(str(UPSTREAM_CONFIG))


@cache
def _installed(path: str) -> dict[str, dict[str, Any]]:
    try:
        stages = (yaml.safe_load(Path(path).read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        return {}
    return {
        name: dict(entry)
        for name, entry in stages.items()
        if isinstance(entry, dict) and entry.get("python") and os.access(str(entry["python"]), os.X_OK)
    }


def default_stage(cls: Any, mode: str) -> dict[str, Any]:
    """The settings of stage class ``cls`` (its backend, params, python) when the settings name no backend."""
    base: dict[str, Any] = {
        "enabled": not cls.optional,
        "backend": cls.default_backend,
        "params": dict(cls.default_params),
        "deadline_s": cls.default_deadline_s,
    }
    cpu = getattr(cls, "cpu_backend", "")
    if not cpu or cls.default_backend:  # no model, or a stage with a fixed default (masks: none)
        return base
    if mode == "synthetic":
        return {**base, "backend": "synthetic"}
    upstream = upstream_layout().get(cls.name) if mode == "auto" else None
    if upstream is not None and upstream.get("backend"):
        # y2r's model, as configs/real-gpu.yaml runs it; an optional stage stays as that file says.
        keep: dict[str, Any] = {k: upstream[k] for k in ("backend", "params", "python", "deadline_s") if k in upstream}
        return {**base, **keep, "enabled": base["enabled"] or bool(upstream.get("enabled", False))}
    return {**base, "backend": cpu}


# What each backend is, and what it is not, for the run's first lines and its summary.
WHAT: dict[tuple[str, str], str] = {
    ("depth", "classical"): "classical two-view geometry on the CPU: relative scale from a depth prior, "
    "a fixed field of view; no ViPE",
    ("depth", "vipe"): "ViPE (y2r's model): metric depth and camera poses",
    ("depth", "synthetic"): "SYNTHETIC: made-up depth and cameras computed from pixel brightness, not a model",
    ("tracks", "opencv"): "Lucas-Kanade optical flow on the CPU lifted with the depth: no occlusion "
    "handling; no TAPIP3D",
    ("tracks", "tapip3d"): "TAPIP3D (y2r's model): learned 3D point tracks",
    ("tracks", "synthetic"): "SYNTHETIC: made-up tracks that follow the made-up depth, not a model",
    ("tracks2d", "opencv"): "Lucas-Kanade optical flow on the CPU; no CoTracker",
    ("tracks2d", "cotracker"): "CoTracker (y2r's model): learned 2D point tracks",
    ("tracks2d", "synthetic"): "SYNTHETIC: made-up 2D tracks, not a model",
    ("hands", "mediapipe"): "MediaPipe hand landmarks on the CPU: no MANO finger poses or shape; no WiLoR",
    ("hands", "wilor"): "WiLoR (y2r's model): MANO hand poses",
    ("hands", "synthetic"): "SYNTHETIC: made-up hand poses, not a model",
    ("masks", "none"): "no masks: every pixel may hold a query point",
    ("masks", "grounded_sam"): "Grounded-SAM (y2r's models): object masks from the text prompt",
    ("masks", "sam3"): "SAM 3 (y2r's default masks model): object masks from the text prompt",
}


def what(stage: str, backend: str) -> str:
    """One line on what ``backend`` of ``stage`` is and is not; a plugin's is "a plugin backend"."""
    return WHAT.get((stage, backend), "a plugin backend (framefleet.backends entry point)")


def unnamed_backend(cls: Any) -> str:
    """The backend of a model stage built in code with none named (not from the settings): its CPU backend, or
    ``synthetic`` when ``$FRAMEFLEET_DEFAULT_BACKENDS`` (the setting's variable) asks for it, as the tests do."""
    if os.environ.get(MODE_ENV) == "synthetic":
        return "synthetic"
    return str(cls.cpu_backend)


def is_synthetic(backend: str) -> bool:
    return backend == "synthetic"


def describe(backends: dict[str, str]) -> list[str]:
    """One line per stage: ``depth: classical — what it is and is not``; a warning line first if one is synthetic."""
    backends = {stage: name for stage, name in backends.items() if name != "builtin"}  # stages without a model
    lines = [f"{stage}: {name} — {what(stage, name)}" for stage, name in backends.items()]
    made_up = [stage for stage, name in backends.items() if is_synthetic(name)]
    if made_up:
        lines.insert(
            0,
            f"WARNING: {', '.join(made_up)} {'uses' if len(made_up) == 1 else 'use'} the SYNTHETIC backends: "
            "made-up outputs for tests and demos, "
            "not measurements; do not train on them (drop default_backends: synthetic and name no synthetic backend)",
        )
    return lines

"""Per-video quality gates: what each stage measured (its ``quality``) against the settings' ``quality:`` thresholds,
and the length check that refuses a video too short for the chain before any model runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tasks.errors import BadInput, LowQuality
from tasks.stages.base import Gate
from worker_config.settings import QualityGates, Settings

# In the BadInput of a video too short for the chain; the report counts the videos it refused by it.
TOO_SHORT = "too short for the chain"


@dataclass(frozen=True)
class Shortfall:
    """One measure on the wrong side of its gate: the stage, the measure, its value, the setting and its threshold."""

    stage: str
    measure: str
    value: Any
    setting: str
    threshold: Any

    def text(self) -> str:
        return f"{self.stage} {self.measure} {self.value} (quality.{self.setting}: {self.threshold})"


def _fails(gate: Gate, value: Any, threshold: Any) -> bool:
    if value is None:
        return False
    if gate.kind == "allow":
        return value == gate.bad and not threshold
    if threshold is None:
        return False
    return float(value) < float(threshold) if gate.kind == "min" else float(value) > float(threshold)


def shortfalls(quality: Mapping[str, Mapping[str, Any]] | None, gates: QualityGates) -> list[Shortfall]:
    """Return every stage gate that ``quality`` (stage -> its measures) fails; [] when it passes or measured nothing."""
    from tasks.stages import ALL

    found: list[Shortfall] = []
    for cls in ALL:
        measured = (quality or {}).get(cls.name) or {}
        for gate in cls.gates:
            value, threshold = measured.get(gate.measure), getattr(gates, gate.setting)
            if _fails(gate, value, threshold):
                found.append(Shortfall(cls.name, gate.measure, value, gate.setting, threshold))
    return found


def enforce(quality: Mapping[str, Mapping[str, Any]] | None, gates: QualityGates) -> None:
    """Raise LowQuality naming each measure below its gate, with the value and the threshold; else return."""
    found = shortfalls(quality, gates)
    if found:
        raise LowQuality(
            "below the quality gates: "
            + "; ".join(s.text() for s in found)
            + ". Change the thresholds under quality: in the settings (then --retry-quarantined) if the video is fine",
            {"shortfalls": [asdict(s) for s in found], "quality": dict(quality or {})},
        )


def check_length(video: str, frames: int, chain: Sequence[str], conf: Settings) -> None:
    """Raise BadInput when ``frames`` (the video's, after resampling) are fewer than a stage of ``chain`` needs
    (``Stage.min_frames`` of its settings' params: a track window); else return."""
    from tasks.stages import stage_class

    needs = {name: stage_class(name).min_frames(conf.stages[name].params) for name in chain}
    name, least = max(needs.items(), key=lambda item: item[1])
    if frames < least:
        raise BadInput(
            f"{video}: {TOO_SHORT}: {frames} frame(s) after resampling to "
            f"stages.preprocess.params.target_fps, fewer than one {name} window "
            f"(stages.{name}.params.window_length: {least}); use a longer clip, or a smaller window_length"
        )


def caught(
    low_quality: Mapping[str, Sequence[Mapping[str, Any] | str]], failed: Sequence[Mapping[str, Any]]
) -> dict[str, int]:
    """How many videos each gate kept out: ``quality.<setting>`` -> videos below it (``low_quality``: video id ->
    its shortfalls), and "too short" -> the videos refused by ``check_length`` (``failed``: the summary's)."""
    counts: dict[str, int] = {}
    for shortfalls in low_quality.values():
        # A shortfall is a Shortfall's dict; a bare name stands for its setting (as hand-written records give it).
        for setting in sorted({str(s.get("setting") if isinstance(s, Mapping) else s) for s in shortfalls}):
            counts[f"quality.{setting}"] = counts.get(f"quality.{setting}", 0) + 1
    short = sum(1 for f in failed if f.get("error_class") == "BadInput" and TOO_SHORT in str(f.get("reason", "")))
    if short:
        counts["too short (bad_input)"] = short
    return counts

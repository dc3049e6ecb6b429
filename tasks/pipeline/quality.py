"""Per-video quality gates: what each stage measured (its ``quality``) against the settings' ``quality:`` thresholds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tasks.errors import LowQuality
from tasks.stages.base import Gate
from worker_config.settings import QualityGates


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

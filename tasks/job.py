"""The job message a video's chain passes from stage to stage: one small typed object, JSON on the wire."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class Job:
    """One video's work order and what its stages reported so far.

    Paths are absolute roots plus a path relative to them (``video`` under ``dataset_root``);
    times are epoch seconds. ``failed`` holds the failure record once a stage failed for good
    (the later stages then pass the job on untouched); ``chain`` is the stage order decided at
    enqueue. Fields a newer sender added and this version does not know travel on in ``extra``.
    """

    run_id: str
    video_id: str
    video: str
    dataset_root: str
    output_root: str
    chain: tuple[str, ...] = ()
    gpus: tuple[int, ...] | None = None
    gpu: int | None = None
    force: bool = False
    text: str = ""
    noun: str = ""
    timings: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    failed: dict[str, Any] | None = None
    chunk_scale: float = 1.0
    avoid_gpu: int | None = None
    oom_peak_mib: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        """Read a job from its wire form; raises ValueError naming a missing field."""
        known = {f.name for f in fields(cls)} - {"extra"}
        missing = [f.name for f in fields(cls) if f.name in ("run_id", "video_id", "video", "dataset_root",
                                                             "output_root") and f.name not in data]
        if missing:
            raise ValueError(f"a job message lacks {', '.join(missing)}: it was not sent by framefleet's enqueue")
        values = {k: v for k, v in data.items() if k in known}
        if values.get("chain") is not None:
            values["chain"] = tuple(values["chain"])
        if values.get("gpus") is not None:
            values["gpus"] = tuple(int(g) for g in values["gpus"])
        extra = {**data.get("extra", {}), **{k: v for k, v in data.items() if k not in known and k != "extra"}}
        return cls(**values, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: plain JSON types, unknown fields passed through at the top level."""
        data = asdict(self)
        extra = data.pop("extra")
        data["chain"] = list(self.chain)
        data["gpus"] = None if self.gpus is None else list(self.gpus)
        return {**extra, **data}

    def with_(self, **changes: Any) -> Job:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)

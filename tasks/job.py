"""The job message a video's chain passes from stage to stage: a small typed value, a JSON dict on the wire.

A stage task receives the dict, reads it once with ``Job.from_dict`` and returns ``job.to_dict()``
for the next stage; everything in between works on the ``Job``. The wire keys are those of
earlier versions, so messages already waiting in a broker are read as before, and a key this
version does not know (from a newer or older version) is kept in ``extra`` and written back
unchanged. Optional fields at their default are left out of the dict, as earlier versions did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.errors import BadJobMessage

REQUIRED = ("run_id", "video_id", "video", "dataset_root", "output_root")  # what a stage task needs to run
IDENTITY = ("run_id", "video_id")  # what a queued message needs to be taken for a job (``Job.peek``)


@dataclass(frozen=True)
class Failure:
    """Why a video's chain stopped: the stage, the error class and reason, and where and when."""

    stage: str
    error_class: str
    reason: str
    attempts: int
    worker: str
    time: float  # unix time, s
    detail: Mapping[str, Any] | None = None  # structured facts (a quality gate's value and threshold)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.detail is None:
            out.pop("detail")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Failure:
        names = [f.name for f in dataclasses.fields(cls)]
        _require(data, names[:-1], "failure record")
        return cls(**{name: data[name] for name in names if name in data})


@dataclass(frozen=True)
class StageTiming:
    """One finished stage of a video: wall-clock start and end (unix s), its worker, and whether it did work."""

    start: float
    end: float
    worker: str
    skipped: bool
    run_s: float = 0.0  # seconds inside the stage's own run (the model); absent in early messages

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageTiming:
        _require(data, ("start", "end", "worker", "skipped"), "stage timing")
        return cls(data["start"], data["end"], data["worker"], data["skipped"], data.get("run_s", 0.0))


@dataclass(frozen=True)
class Job:
    """One video of one run, as its chain's stages pass it on; evolve it with ``dataclasses.replace``."""

    run_id: str
    video_id: str
    video: str = ""  # path relative to dataset_root
    dataset_root: str = ""
    output_root: str = ""
    chain: tuple[str, ...] = ()  # the stages this video runs (decided at enqueue); () for the worker's own
    gpus: tuple[int, ...] | None = None  # GPUs the run may use; None for any
    gpu: int | None = None  # the GPU of the last stage that ran on one
    force: bool = False
    intermediates: str = "keep"  # "keep" or "drop" OUT/work/<video>/ once the dataset file is written
    text: str = ""
    noun: str = ""
    timings: Mapping[str, StageTiming] = field(default_factory=dict)  # stage -> its timing
    notes: Mapping[str, Any] = field(default_factory=dict)  # stage -> facts for the run summary
    report: Mapping[str, Any] | None = None  # the dataset stage's report, less its statistics
    failed: Failure | None = None
    chunk_scale: float = 1.0  # fraction of activation memory models use, halved after each OOM
    avoid_gpu: int | None = None  # the GPU of the last OOM
    oom_peak_mib: float = 0.0  # the largest device memory a failed call of this video needed
    claim_waits: int = 0  # retries of the current stage that waited for a claim or for a worker (not failures)
    # stage -> sha256 of the settings it must run under (worker_config.settings.stage_entry), decided at
    # enqueue; {} (a job of an earlier version) runs under whatever settings its worker has
    settings: Mapping[str, str] = field(default_factory=dict)
    seal: str = ""  # the enqueuer's HMAC over the fields above it decides (tasks.run.seal); "" for an earlier version
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as they came

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe wire form: the enqueue-time keys always, the others only when set."""
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "video_id": self.video_id,
            "video": self.video,
            "dataset_root": self.dataset_root,
            "output_root": self.output_root,
            "gpus": None if self.gpus is None else list(self.gpus),
            "gpu": self.gpu,
            "force": self.force,
            "intermediates": self.intermediates,
            "text": self.text,
            "noun": self.noun,
            "chain": list(self.chain),
        }
        if self.timings:
            out["timings"] = {stage: t.to_dict() for stage, t in self.timings.items()}
        if self.notes:
            out["notes"] = dict(self.notes)
        if self.report is not None:
            out["report"] = dict(self.report)
        if self.failed is not None:
            out["failed"] = self.failed.to_dict()
        if self.settings:
            out["settings"] = dict(self.settings)
        for key in ("chunk_scale", "avoid_gpu", "oom_peak_mib", "claim_waits", "seal"):
            if getattr(self, key) != _DEFAULTS[key]:
                out[key] = getattr(self, key)
        return {**self.extra, **out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], required: tuple[str, ...] = REQUIRED) -> Job:
        """Read a wire dict (of this version or an earlier one); raises BadJobMessage naming a missing key."""
        if not isinstance(data, Mapping):
            raise BadJobMessage(f"a job message is a JSON object, not {type(data).__name__}: {data!r:.200}")
        _require(data, required, "job message")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        # A null (or an empty failure record) reads as the default, as earlier versions' job.get(key) did.
        values: dict[str, Any] = {
            k: v for k, v in data.items() if k in known and (v is not None or _DEFAULTS.get(k, ...) is None)
        }
        if not values.get("failed"):
            values.pop("failed", None)
        try:
            if "chain" in values:
                values["chain"] = tuple(values["chain"])
            if values.get("gpus") is not None:
                values["gpus"] = tuple(values["gpus"])
            if values.get("timings"):
                values["timings"] = {s: StageTiming.from_dict(t) for s, t in values["timings"].items()}
            if "failed" in values:
                values["failed"] = Failure.from_dict(values["failed"])
            return cls(**values, extra={k: v for k, v in data.items() if k not in known})
        except (TypeError, AttributeError) as exc:
            raise BadJobMessage(f"job message of video {data.get('video_id')!r} has a malformed field: {exc}") from exc

    @classmethod
    def peek(cls, data: Any) -> Job | None:
        """The job a queued message carries, or None when ``data`` is not one (a tool's view, never run)."""
        try:
            return cls.from_dict(data, required=IDENTITY)
        except BadJobMessage:
            return None


# Fields with a plain default (the mappings' default is built per instance and is not None).
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Job) if f.default is not dataclasses.MISSING}


def _require(data: Mapping[str, Any], keys: Any, what: str) -> None:
    for key in keys:
        if key not in data:
            raise BadJobMessage(
                f"{what} lacks {key!r} (it has {sorted(data)}); it was not made by framefleet enqueue "
                "or was cut short: enqueue the run again with --continue"
            )

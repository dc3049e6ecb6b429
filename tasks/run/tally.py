"""The run summary's per-video parts as values that add: a video's ``counts`` (integers, stage times in
microseconds) are added to the run's counters in Redis as it finishes (tasks.run.completion), and the run's
end turns those counters into the summary's figures (``Tally.add_counts``). ``Tally.add`` still takes whole
outcomes (an earlier version's chord results and outcomes kept in Redis)."""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tasks.job import IDENTITY, Job
from tasks.records.outcome_files import fields_of
from tasks.statistics.sums import LIMBS, mark_of

DIGEST_LIMBS = f"<{LIMBS}H"  # a video's mark as the limbs of tasks.statistics.sums.digest_of


class _Spans:
    """One stage's spans: how many, skipped, per worker, and the durations' count, sum and maximum; the gaps
    after the stage before it likewise (fields, not methods: a million videos pass through here)."""

    def __init__(self) -> None:
        self.tasks, self.skipped, self.ran, self.total_s, self.max_s = 0, 0, 0, 0.0, float("-inf")
        self.workers: Counter[str] = Counter()
        self.gaps, self.gap_total_s, self.gap_max_s = 0, 0.0, float("-inf")


def classify(run_id: str, outcome: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(video id, "done", its report), (id, "low_quality", the gate's detail) or (id, "failed", {}) of an
    outcome (tasks.run.completion.OUTCOME_KEYS). Raises tasks.errors.BadJobMessage without its identity."""
    failure = failure_of(run_id, outcome)
    if failure is not None:
        detail = failure.get("detail")
        return failure["video_id"], ("low_quality" if detail else "failed"), dict(detail or {})
    return outcome["video_id"], "done", dict(outcome.get("report") or {})


def failure_of(run_id: str, outcome: dict[str, Any]) -> dict[str, Any] | None:
    """The summary's record of a failed outcome (video id, video, the failure's fields), None when it is done.
    Raises tasks.errors.BadJobMessage on a failed outcome without its identity."""
    if not outcome.get("failed"):
        return None
    job = Job.from_dict({"run_id": run_id, **outcome}, required=IDENTITY)
    assert job.failed is not None
    return {"video_id": job.video_id, "video": job.video, **job.failed.to_dict()}


def provenance_set(report: dict[str, Any]) -> str:
    """The JSON of a done video's [backends, settings hash, framefleet version] as its outcomes line records
    them (tasks.records.outcome_files.fields_of; the statistics file's header counts videos by it)."""
    prov = fields_of("done", report).get("provenance") or {}
    return json.dumps([prov.get("backends"), prov.get("settings_sha256"), prov.get("framefleet")])


def _us(seconds: float) -> int:
    # Epoch seconds in float64 are spaced 0.24 µs apart near 1.7e9 s: a whole µs is exact.
    return round(seconds * 1_000_000)


def counts(outcome: dict[str, Any], stages: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
    """What a done video adds to its run's counters: (fields to add, fields to raise to at least), integers,
    stage times and the gaps between stages in whole microseconds; ``Tally.add_counts`` reads them."""
    add: dict[str, int] = {"done": 1}
    most: dict[str, int] = {}
    report = dict(outcome.get("report") or {})
    backends = (report.get("provenance") or {}).get("backends")
    if isinstance(backends, dict):
        add["b:" + json.dumps(sorted(backends.items()))] = 1
    elif report.get("provenance"):
        add["j:" + json.dumps(backends)] = 1
    add["p:" + provenance_set(report)] = 1
    for i, limb in enumerate(struct.unpack(DIGEST_LIMBS, mark_of(outcome["video_id"]))):
        add[f"d:{i}"] = limb  # the done videos' digest, as the running sums keep their videos'
    timings = outcome.get("timings") or {}
    previous = None
    for stage in stages:
        span = timings.get(stage)
        if span is not None:
            add[f"s:{stage}:tasks"] = 1
            add[f"w:{stage}:{span['worker']}"] = 1
            if span["skipped"]:
                add[f"s:{stage}:skipped"] = 1
            else:
                took = _us(span["end"]) - _us(span["start"])
                add[f"s:{stage}:ran"], add[f"s:{stage}:us"], most[f"s:{stage}:max_us"] = 1, took, took
            if previous is not None:
                gap = _us(span["start"]) - _us(previous["end"])
                add[f"s:{stage}:gaps"], add[f"s:{stage}:gap_us"], most[f"s:{stage}:gap_max_us"] = 1, gap, gap
        previous = span
    return add, most


class Tally:
    """What run_summary.json says of a run's videos, from their outcomes (tasks.run.completion.OUTCOME_KEYS,
    or an earlier version's whole job messages) given one at a time to ``add``."""

    def __init__(self, run_id: str, stages: Sequence[str]) -> None:
        self.run_id, self.stages = run_id, list(stages)
        self.videos = 0
        self.done: list[str] = []  # the videos given to ``add`` that are done
        self.counted_done = 0  # the done videos of ``add_counts``
        self.failed: list[dict[str, Any]] = []
        self.low: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, dict[str, Any]] = {}
        self.backend_sets: Counter[tuple[tuple[str, Any], ...] | str] = Counter()
        self.provenance_sets: Counter[str] = Counter()  # provenance_set → done videos
        self.done_digest: list[int] | None = [0] * LIMBS  # of the done videos of ``add_counts`` (None: not known)
        self.spans = {stage: _Spans() for stage in stages}

    def add(self, outcome: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        """Count one video; return (its id, "done", its report), (id, "low_quality", the gate's detail)
        or (id, "failed", {}). Raises tasks.errors.BadJobMessage on an outcome without its identity."""
        self.videos += 1
        if outcome.get("notes"):
            self.notes[outcome["video_id"]] = dict(outcome["notes"])
        failure = failure_of(self.run_id, outcome)
        if failure is not None:
            self.failed.append(failure)
            vid = failure["video_id"]
            if failure.get("detail"):
                self.low[vid] = dict(failure["detail"])
                return vid, "low_quality", self.low[vid]
            return vid, "failed", {}
        vid = outcome["video_id"]
        self.done.append(vid)
        report = dict(outcome.get("report") or {})
        backends = (report.get("provenance") or {}).get("backends")
        if isinstance(backends, dict):
            self.backend_sets[tuple(sorted(backends.items()))] += 1
        elif report.get("provenance"):
            self.backend_sets[json.dumps(backends)] += 1
        self.provenance_sets[provenance_set(report)] += 1
        timings = outcome.get("timings") or {}
        previous = None
        for stage, spans in self.spans.items():
            span = timings.get(stage)
            if span is not None:
                spans.tasks += 1
                spans.workers[span["worker"]] += 1
                if span["skipped"]:
                    spans.skipped += 1
                else:
                    took = span["end"] - span["start"]
                    spans.ran += 1
                    spans.total_s += took
                    if took > spans.max_s:
                        spans.max_s = took
                if previous is not None:
                    gap = span["start"] - previous["end"]
                    spans.gaps += 1
                    spans.gap_total_s += gap
                    if gap > spans.gap_max_s:
                        spans.gap_max_s = gap
            previous = span
        return vid, "done", report

    def add_counts(self, fields: dict[str, int], failed: list[dict[str, Any]], notes: dict[str, Any]) -> None:
        """Add a run's counters (``counts`` summed over its done videos, tasks.run.completion), the failure
        records of its failed videos and the notes of its videos."""
        self.counted_done += int(fields.get("done", 0))
        digest = [fields.get(f"d:{i}") for i in range(LIMBS)]
        if self.done_digest is not None and (None not in digest or not fields.get("done")):
            self.done_digest = [a + int(b or 0) for a, b in zip(self.done_digest, digest, strict=True)]
        else:
            self.done_digest = None  # counted by a version without it
        self.videos += int(fields.get("done", 0)) + len(failed)
        for record in failed:
            self.failed.append(record)
            if record.get("detail"):
                self.low[record["video_id"]] = dict(record["detail"])
        self.notes.update(notes)
        for name, value in fields.items():
            kind, _, rest = name.partition(":")
            if kind == "b":
                self.backend_sets[tuple((k, v) for k, v in json.loads(rest))] += int(value)
            elif kind == "j":
                self.backend_sets[rest] += int(value)
            elif kind == "d":
                pass  # done_digest
            elif kind == "p":
                self.provenance_sets[rest] += int(value)
            elif kind == "w":
                stage, _, worker = rest.partition(":")
                if stage in self.spans:
                    self.spans[stage].workers[worker] += int(value)
            elif kind == "s":
                stage, _, what = rest.partition(":")
                if stage in self.spans:
                    _add_span(self.spans[stage], what, int(value))

    def backends(self) -> dict[str, Any] | None:
        """The backends most of the done videos' files record, or None when none records them."""
        if not self.backend_sets:
            return None
        found = self.backend_sets.most_common(1)[0][0]
        return json.loads(found) if isinstance(found, str) else dict(found)

    def stage_timings(self) -> dict[str, Any]:
        """Per-stage durations and the overhead between one stage's end and the next one's start."""
        out: dict[str, Any] = {}
        for i, stage in enumerate(self.stages):
            s = self.spans[stage]
            entry: dict[str, Any] = {"tasks": s.tasks, "skipped": s.skipped, "workers": dict(s.workers)}
            if s.ran:
                entry.update(mean_s=s.total_s / s.ran, max_s=s.max_s, total_s=s.total_s)
            if i and s.gaps:
                entry["overhead_after_" + self.stages[i - 1]] = {
                    "mean_s": s.gap_total_s / s.gaps,
                    "max_s": s.gap_max_s,
                }
            out[stage] = entry
        return out


# A stage counter of tasks.run.tally.counts holding a time: the span's field it adds to (or raises), and its
# units a second; ``ms``, ``max``, ``gap_ms`` and ``gap_max`` are an earlier version's milliseconds (a run it
# counted may end under this one).
_SUMS = {
    "us": ("total_s", 1_000_000),
    "gap_us": ("gap_total_s", 1_000_000),
    "ms": ("total_s", 1000),
    "gap_ms": ("gap_total_s", 1000),
}
_MAXIMA = {
    "max_us": ("max_s", 1_000_000),
    "gap_max_us": ("gap_max_s", 1_000_000),
    "max": ("max_s", 1000),
    "gap_max": ("gap_max_s", 1000),
}


def _add_span(spans: _Spans, what: str, value: int) -> None:
    """Add one stage counter (tasks.run.tally.counts' names) to ``spans``."""
    if what in ("tasks", "skipped", "ran", "gaps"):
        setattr(spans, what, getattr(spans, what) + value)
    elif what in _SUMS:
        field, per_s = _SUMS[what]
        setattr(spans, field, getattr(spans, field) + value / per_s)
    elif what in _MAXIMA:
        field, per_s = _MAXIMA[what]
        setattr(spans, field, max(getattr(spans, field), value / per_s))

"""The run summary's per-video parts, added up one outcome at a time as the statistics callback reads them:
no list of every video's job is held (a million videos' outcomes are read in chunks from Redis)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tasks.job import IDENTITY, Job


class _Spans:
    """One stage's spans: how many, skipped, per worker, and the durations' count, sum and maximum."""

    def __init__(self) -> None:
        self.tasks, self.skipped, self.ran, self.total_s, self.max_s = 0, 0, 0, 0.0, 0.0
        self.workers: Counter[str] = Counter()
        self.gaps, self.gap_total_s, self.gap_max_s = 0, 0.0, float("-inf")

    def add(self, span: dict[str, Any]) -> None:
        self.tasks += 1
        self.workers[span["worker"]] += 1
        if span["skipped"]:
            self.skipped += 1
            return
        took = span["end"] - span["start"]
        self.total_s += took
        self.max_s = took if self.ran == 0 else max(self.max_s, took)
        self.ran += 1

    def gap(self, seconds: float) -> None:
        self.gaps += 1
        self.gap_total_s += seconds
        self.gap_max_s = max(self.gap_max_s, seconds)


class Tally:
    """What run_summary.json says of a run's videos, from their outcomes (tasks.run.completion.OUTCOME_KEYS,
    or an earlier version's whole job messages) given one at a time to ``add``."""

    def __init__(self, run_id: str, stages: Sequence[str]) -> None:
        self.run_id, self.stages = run_id, list(stages)
        self.videos = 0
        self.done: list[str] = []
        self.failed: list[dict[str, Any]] = []
        self.low: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, dict[str, Any]] = {}
        self.backend_sets: Counter[str] = Counter()
        self.spans = {stage: _Spans() for stage in stages}

    def add(self, outcome: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        """Count one video; return (its id, "done", its report), (id, "low_quality", the gate's detail)
        or (id, "failed", {}). Raises tasks.errors.BadJobMessage on an outcome without its identity."""
        self.videos += 1
        if outcome.get("notes"):
            self.notes[outcome["video_id"]] = dict(outcome["notes"])
        if outcome.get("failed"):
            job = Job.from_dict({"run_id": self.run_id, **outcome}, required=IDENTITY)
            assert job.failed is not None
            self.failed.append({"video_id": job.video_id, "video": job.video, **job.failed.to_dict()})
            if job.failed.detail:
                self.low[job.video_id] = dict(job.failed.detail)
                return job.video_id, "low_quality", self.low[job.video_id]
            return job.video_id, "failed", {}
        vid = outcome["video_id"]
        self.done.append(vid)
        report = dict(outcome.get("report") or {})
        if report.get("provenance"):
            self.backend_sets[json.dumps(report["provenance"].get("backends"), sort_keys=True)] += 1
        timings = outcome.get("timings") or {}
        previous = None
        for stage in self.stages:
            span = timings.get(stage)
            if span is not None:
                self.spans[stage].add(span)
                if previous is not None:
                    self.spans[stage].gap(span["start"] - previous["end"])
            previous = span
        return vid, "done", report

    def backends(self) -> dict[str, Any] | None:
        """The backends most of the done videos' files record, or None when none records them."""
        return json.loads(self.backend_sets.most_common(1)[0][0]) if self.backend_sets else None

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

"""The run summary's per-video parts, added up one outcome at a time as the statistics callback reads them:
no list of every video's job is held (a million videos' outcomes are read in chunks from Redis)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tasks.job import IDENTITY, Job


class _Spans:
    """One stage's spans: how many, skipped, per worker, and the durations' count, sum and maximum; the gaps
    after the stage before it likewise (fields, not methods: a million videos pass through here)."""

    def __init__(self) -> None:
        self.tasks, self.skipped, self.ran, self.total_s, self.max_s = 0, 0, 0, 0.0, float("-inf")
        self.workers: Counter[str] = Counter()
        self.gaps, self.gap_total_s, self.gap_max_s = 0, 0.0, float("-inf")


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
        self.backend_sets: Counter[tuple[tuple[str, Any], ...] | str] = Counter()
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
        backends = (report.get("provenance") or {}).get("backends")
        if isinstance(backends, dict):
            self.backend_sets[tuple(sorted(backends.items()))] += 1
        elif report.get("provenance"):
            self.backend_sets[json.dumps(backends)] += 1
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

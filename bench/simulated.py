"""Simulated videos of realistic size for the million-video benchmarks (bench/scale.py, bench/live_run.py):
a real video's partial statistics varied per video, its outcome as the statistics callback records it, and
the paths of a folder sharded into 256 sub-folders."""

from __future__ import annotations

from typing import Any

import numpy as np


def realistic_partials(marker: dict[str, Any], n: int, seed: int = 25) -> np.ndarray:
    """``n`` rows (tasks.statistics.stats.to_row) around one real video's partial: each field's count, means and
    M2 varied per video (so the order of merging matters as it does in a run), the real row's width."""
    from tasks.statistics.stats import row_layout, to_row

    base = to_row(marker["report"]["stats"], "3d")
    rng = np.random.default_rng(seed)
    rows = np.repeat(base[None, :], n, axis=0)
    at = 0
    for _f, dim in row_layout("3d"):
        rows[:, at] = np.maximum(0, np.round(base[at] * rng.uniform(0.5, 1.5, n)))
        rows[:, at + 1 : at + 1 + dim] *= 1 + 0.2 * rng.standard_normal((n, dim))
        rows[:, at + 1 + dim : at + 1 + 2 * dim] *= rng.uniform(0.5, 1.5, (n, dim))
        at += 1 + 2 * dim
    return rows


def realistic_outcome(marker: dict[str, Any], summary: dict[str, Any], vid: str, i: int) -> dict[str, Any]:
    """A finished video's outcome as tasks.run.completion records it: the real marker's report (less its
    statistics, its source hash made per video), five stage timings on two workers."""
    report = {k: v for k, v in marker["report"].items() if k != "stats"}
    prov = dict(report.get("provenance") or {})
    prov["source"] = {"bytes": 100_000 + i, "path": vid + ".mp4", "sha256": f"{i:064x}"[::-1]}
    report["provenance"] = prov
    start, timings = summary["started"] + 0.37 * i, {}
    for k, stage in enumerate(summary["stages"]):
        took = 0.05 + ((i * 7919 + k * 104729) % 1000) / 2000
        timings[stage] = {
            "start": start,
            "end": start + took,
            "worker": f"gpu0+cpu-{1 + (i + k) % 2}@bench",
            "skipped": False,
            "run_s": took * 0.93,
        }
        start += took + 0.012
    return {"video_id": vid, "video": vid + ".mp4", "timings": timings, "gpu": 0, "report": report}


def sharded_path(i: int) -> str:
    return f"s{i % 256:02x}/v{i:07d}.mp4"


def earlier_line(vid: str, status: str, found: dict[str, Any]) -> str:
    """A video's outcomes line as versions before JSON Lines wrote it: its id, a tab, the fields (JSON) that
    tasks.records.outcome_files.fields_of gives, which still read (bench/scale.py's baseline trees read only these)."""
    import json

    from tasks.records.outcome_files import fields_of

    return f"{vid}\t{json.dumps(fields_of(status, found))}\n"

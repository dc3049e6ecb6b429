"""The findings of bench/gpu_real_autoscale.sh, from its results folder: one line per measure.

Busy fraction = the compute bound ÷ the one-GPU run (enqueue → statistics); scaling efficiency =
T1 ÷ (2 · T2). A family's workers are counted from the autoscaler's decisions (ff:autoscale).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    """The JSON of ``path`` (or of its last line); None when missing or unreadable."""
    try:
        text = path.read_text().strip()
        try:
            return json.loads(text)
        except ValueError:
            return json.loads(text.splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def families(decisions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per family (queue): the most workers it had at once, and the peak and capacity of its last scale-up."""
    now: dict[str, int] = {}
    out: dict[str, dict[str, Any]] = {}
    for d in decisions:
        queue = (d.get("worker") or "?").rpartition("-")[0] or d.get("queue") or "?"
        row = out.setdefault(queue, {"max_workers": 0, "peak_mib": None, "capacity": None, "ups": 0})
        if d.get("action") == "up":
            now[queue] = now.get(queue, 0) + 1
            row["ups"] += 1
            row["peak_mib"], row["capacity"] = d.get("peak_mib"), d.get("capacity")
        elif d.get("action") == "down":
            now[queue] = now.get(queue, 0) - 1
        row["max_workers"] = max(row["max_workers"], now.get(queue, 0))
    return dict(sorted(out.items()))


def smi_peaks(path: Path) -> dict[str, float]:
    """Per GPU index, the peak of memory.used (MiB) in an nvidia-smi CSV of "index, util, used" rows."""
    peaks: dict[str, float] = {}
    if not path.is_file():
        return peaks
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[2].replace(".", "").isdigit():
            peaks[parts[0]] = max(peaks.get(parts[0], 0.0), float(parts[2]))
    return peaks


def phase_lines(res: Path, tag: str) -> tuple[list[str], float | None]:
    summary = _load(res / f"{tag}-summary.json")
    red = _load(res / f"{tag}-redis.json") or {}
    if summary is None:
        return [f"{tag}: no run_summary.json (see {tag}-enqueue.txt)"], None
    verify = (
        (res / f"{tag}-verify.txt").read_text().strip().splitlines() if (res / f"{tag}-verify.txt").is_file() else []
    )
    oom_logs = (res / f"{tag}-oom-logs.txt").read_text().split() if (res / f"{tag}-oom-logs.txt").is_file() else []
    wall = float(summary["wall_s"])
    lines = [
        f"{tag}: enqueue -> statistics {wall:.1f} s; done {summary.get('done')}, failed {summary.get('failed')}, "
        f"quarantined {summary.get('quarantined', 0)}; OOM records {len(red.get('oom', []))}, worker logs naming an "
        f"OOM {len(oom_logs)}; verify: {' / '.join(verify[-2:])}",
        f"{tag}: GPU memory used, peak MiB per GPU: {smi_peaks(res / f'{tag}-smi.csv')}",
    ]
    if (res / f"{tag}-busy.txt").is_file():  # bench/busy_share.py: NVML sampled at 4 Hz over enqueue -> statistics
        lines += [f"{tag}: sampled {line}" for line in (res / f"{tag}-busy.txt").read_text().splitlines()]
    for queue, row in families(red.get("decisions", [])).items():
        lines.append(
            f"{tag}:   {queue}: at most {row['max_workers']} worker(s); packed by a peak of {row['peak_mib']} MiB "
            f"(capacity {row['capacity']})"
        )
    lines.append(f"{tag}: profiles {json.dumps(red.get('profiles', {}))}")
    return lines, wall


def report(res: Path) -> str:
    lines = [f"GPUs: {' | '.join((res / 'gpus.csv').read_text().strip().splitlines()[1:])}"]
    check = _load(res / "check.json") or {}
    for stage, row in check.items():
        lines.append(f"stage {stage}: {row.get('runs')}; load {row.get('load_s', row.get('error'))}")
    bound = _load(res / "bound.json")
    if bound and bound.get("partial"):
        done, load = bound["per_stage_s"], bound["load_s"]
        lines.append(f"(a) compute bound cut short: {done} (load {load}) over {bound['videos']} videos")
        bound = None
    elif bound:
        lines.append(
            f"(a) compute bound {bound['bound_s']:.1f} s over {bound['videos']} videos: {bound['per_stage_s']}"
        )
    else:
        lines.append("(a) compute bound: none (see bound.err)")
    a_lines, t1 = phase_lines(res, "A")
    lines += a_lines
    if bound and t1:
        lines.append(f"busy fraction (a) / A = {bound['bound_s'] / t1:.3f}")
    if (res / "B-summary.json").is_file() or (res / "B-redis.json").is_file():
        b_lines, t2 = phase_lines(res, "B")
        lines += b_lines
        if t1 and t2:
            lines.append(f"1 -> 2 GPUs: speed-up {t1 / t2:.2f}, efficiency T1 / (2 T2) = {t1 / (2 * t2):.3f}")
    pool = _load(res / "pool.json")
    lines.append(f"pool (spawn until a failure): {json.dumps(pool) if pool else 'none (see pool.err)'}")
    return "\n".join(lines)

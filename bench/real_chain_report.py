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


def compare(res: Path, plot: Path | None = None) -> str:
    """framefleet (phase A: A-summary.json, A-busy.json, A-redis.json) against y2r's way (y2r-summary.json,
    y2r-bound.json, y2r-busy.json) on the same videos: walls, busy shares, the ratio, the compute floor, where the
    time goes per model, and the autoscaler's decisions over time (a PNG at ``plot`` where matplotlib is)."""
    a, y = _load(res / "A-summary.json"), _load(res / "y2r-summary.json")
    bound, red = _load(res / "y2r-bound.json") or {}, _load(res / "A-redis.json") or {}
    if not a or not y:
        return f"compare: needs A-summary.json (STEP=run1) and y2r-summary.json (STEP=y2r) in {res}"
    busy = {
        t: ", ".join(f"GPU {b['gpu']} {b['share']:.3f}" for b in _load(res / f"{t}-busy.json") or [])
        for t in ("A", "y2r")
    }
    report = (res / "report.txt").read_text() if (res / "report.txt").is_file() else ""
    start = next((float(w.split()[3]) for w in report.splitlines() if w.startswith("A: workers up")), 0.0)
    clips: dict[str, int] = {}
    for video in a.get("done_videos", []):
        clips[video.split("_")[0]] = clips.get(video.split("_")[0], 0) + 1
    stages = a.get("stages", {})
    wall, y_wall, floor = float(a["wall_s"]), float(y["wall_s"]), float(bound.get("bound_s") or 0)
    lines = [
        f"the work: {a['videos']} videos ({', '.join(f'{n} {c}' for c, n in sorted(clips.items()))}); framefleet ran "
        + ", ".join(f"{s} {v.get('tasks')}" for s, v in stages.items())
        + f" tasks, quarantined {len(a.get('quarantined', []))}; y2r's way every GPU stage over each of "
        f"{bound.get('videos')} videos; quality gates off (random weights cannot pass them)",
        f"y2r's way (each stage over every video, one process per GPU, loads included): {y_wall:.1f} s; busy share "
        f"{busy['y2r'] or 'not sampled'}; the models' own run time (the compute floor) {floor:.1f} s "
        f"{bound.get('per_stage_s')}",
        f"framefleet (cold cluster): enqueue -> statistics {wall:.1f} s, its workers' start {start:.0f} s before; busy "
        f"share {busy['A'] or 'not sampled'}",
        f"ratio y2r / framefleet {y_wall / wall:.2f} ({y_wall / (wall + start):.2f} counting the workers' start); "
        f"the compute floor allows at most {y_wall / floor if floor else float('nan'):.2f}",
    ]
    loads: dict[str, float] = {}
    for d in red.get("decisions", []):
        if d.get("load_s") is not None:
            loads[d.get("queue", "?")] = max(loads.get(d.get("queue", "?"), 0.0), float(d["load_s"]))
    most = families(red.get("decisions", []))
    for stage, row in (bound.get("stages") or {}).items():
        ff, family = stages.get(stage, {}), next((q for q in most if q.endswith("." + stage)), "")
        lines.append(
            f"  {stage}: y2r load {bound['load_s'].get(stage)} s, first task {row['first_s']} s, steady "
            f"{row['steady_s']} s/video, torch peak {row['peak_mib']} MiB | framefleet load {loads.get(family)} s "
            f"(slowest worker), {ff.get('mean_s', 0):.2f} s/video over {ff.get('tasks')} tasks, at most "
            f"{most.get(family, {}).get('max_workers')} worker(s), peak {most.get(family, {}).get('peak_mib')} MiB"
        )
    began = float(a.get("started") or 0)
    lines.append("autoscaler decisions (s from the enqueue; the GPU's busy % behind each):")
    for d in red.get("decisions", []):
        lines.append(
            f"  {float(d.get('time', began)) - began:+7.1f} {d.get('action')} {d.get('queue')}: "
            f"busy {d.get('busy_pct')} %; {str(d.get('reason'))[:150]}"
        )
    if plot is not None:
        lines.append(_plot(res, red.get("decisions", []), began, float(a.get("finished") or 0), plot))
    return "\n".join(lines)


def _plot(res: Path, decisions: list[dict[str, Any]], began: float, ended: float, out: Path) -> str:
    """Workers per family and the GPU's sampled busy % over the run, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "decision plot: no matplotlib"
    fig, ax = plt.subplots(figsize=(10, 4))
    count: dict[str, int] = {}
    series: dict[str, list[tuple[float, int]]] = {}
    for d in decisions:
        q, step = d.get("queue", "?"), {"up": 1, "down": -1}.get(d.get("action", ""), 0)
        count[q] = count.get(q, 0) + step
        series.setdefault(q, [(float(d["time"]) - began, 0)]).append((float(d["time"]) - began, count[q]))
    for q, points in series.items():
        points.append((ended - began, count[q]))
        ax.step([t for t, _ in points], [n for _, n in points], where="post", label=q)
    ax.set_xlabel("s from the enqueue")
    ax.set_ylabel("workers")
    ax.legend(loc="upper left", fontsize=7)
    samples = res / "A-samples.csv"
    if samples.is_file():
        rows = [line.split(",") for line in samples.read_text().splitlines() if line.count(",") == 3]
        twin = ax.twinx()
        twin.plot([float(r[0]) - began for r in rows], [float(r[2]) for r in rows], color="grey", lw=0.5)
        twin.set_ylabel("GPU busy %")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return f"decision plot: {out}"

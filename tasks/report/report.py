"""Write OUT/report.html: each video's quality with its preview (tasks.report.report_quality), a finished run's
throughput, GPU memory with the autoscaler's decisions, stage durations and failures, as PNG plots in OUT/report/.

    framefleet report OUT [--config FILE]      (or: python -m tasks.report.report OUT)

Reads OUT/run_summary.json; the run's stage log (from Redis while the run is live, else
OUT/runs/<run>.stages.jsonl); from Redis, when it answers, the autoscaler's decisions
(ff:autoscale); and OUT/logs/gpu-samples.jsonl (run_local writes it). What it read is kept in
OUT/report/data.json, so the report can be rebuilt once Redis is gone.
A plot without data is replaced by a sentence saying what is missing. Exit status 0, or 2 without
a run summary.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tasks.cli import common as _cli
from tasks.observe.metrics import AUTOSCALE_KEY
from tasks.redis_client import get_redis
from tasks.run import runs
from tasks.stages import STAGE_NAMES, dataset_stage
from worker_config.settings import Settings

MARGIN_S = 30.0  # samples and decisions this close to the run's window belong to it
MARKERS = {"up": ("^", "tab:green"), "down": ("v", "tab:red"), "restart": ("o", "tab:orange")}


def load(out: Path, conf: Settings) -> dict[str, Any]:
    """The summary, the run's stage log, autoscaler decisions and GPU samples in its window.

    Raises FileNotFoundError without OUT/run_summary.json.
    """
    summary = json.loads((out / "run_summary.json").read_text())
    start = float(summary.get("started") or 0) - MARGIN_S
    end = float(summary.get("finished") or time.time()) + MARGIN_S
    snapshot = out / "report" / "data.json"
    saved = json.loads(snapshot.read_text()) if snapshot.exists() else {}
    if saved.get("run_id") != summary["run_id"]:
        saved = {}
    source = f"a snapshot ({snapshot})" if saved else "nowhere (no stage log in Redis or OUT/runs/, no snapshot)"
    stage_log, decisions = saved.get("stage_log", []), saved.get("autoscale", [])
    r = None
    try:
        r = get_redis(conf.redis_url)
        if runs.lookup(r, summary["run_id"]) is None:  # another Redis: nothing of it is this run's
            print(
                f"framefleet: Redis not read (it does not know run {summary['run_id']}); using the files",
                file=sys.stderr,
            )
            r = None
    except Exception as exc:  # a report from the files alone is still a report
        print(f"framefleet: Redis not read ({type(exc).__name__}); using the files", file=sys.stderr)
        r = None
    mine, where = runs.stage_log(r, out, summary["run_id"])
    if mine:  # Redis or the run's own file: the source; else keep what the snapshot kept
        stage_log, source = mine, where
    try:
        if r is not None and mine:
            records = [json.loads(raw) for raw in r.lrange(AUTOSCALE_KEY, 0, -1)]
            decisions = [d for d in records if start <= float(d.get("time", 0)) <= end]
    except Exception as exc:
        print(f"framefleet: Redis not read ({type(exc).__name__}); using {source}", file=sys.stderr)
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.write_text(json.dumps({"run_id": summary["run_id"], "stage_log": stage_log, "autoscale": decisions}))
    samples = []
    samples_path = out / "logs" / "gpu-samples.jsonl"
    if samples_path.exists():
        for line in samples_path.read_text().splitlines():
            try:
                sample = json.loads(line)
            except ValueError:
                continue  # a line cut short by a killed sampler
            if start <= float(sample["time"]) <= end:
                samples.append(sample)
    return {
        "summary": summary,
        "stage_log": stage_log,
        "autoscale": decisions,
        "samples": samples,
        "source": source,
        "samples_path": samples_path,
    }


def time_axis(summary: dict[str, Any]) -> tuple[float, str]:
    """(seconds per unit, axis label) for the run's length: seconds up to 3 min, minutes up to 3 h, then hours."""
    span = float(summary.get("wall_s") or 0)
    if span <= 180:
        return 1.0, "seconds since the run started"
    if span <= 3 * 3600:
        return 60.0, "minutes since the run started"
    return 3600.0, "hours since the run started"


def done_times(out: Path, data: dict[str, Any]) -> tuple[list[float], str]:
    """When each video of the run was done (epoch s): its h5 stage's end, else its HDF5 file's mtime."""
    ends = sorted(e["end"] for e in data["stage_log"] if e["stage"] == dataset_stage().name and e.get("ok"))
    if ends:
        return ends, "h5 stage ends, stage log"
    paths = [out / f"{vid}.hdf5" for vid in data["summary"].get("done_videos", [])]
    return sorted(p.stat().st_mtime for p in paths if p.exists()), "HDF5 file times"


def plot_throughput(ax: Any, out: Path, data: dict[str, Any]) -> str | None:
    times, source = done_times(out, data)
    if not times:
        return "No video was done in this run, so there is no throughput to plot."
    t0 = float(data["summary"].get("started") or times[0])
    unit, label = time_axis(data["summary"])
    ax.step([0.0, *[(t - t0) / unit for t in times]], range(len(times) + 1), where="post")
    ax.set(xlabel=label, ylabel="videos done", title=f"Throughput (from {source})")
    return None


def plot_gpu_memory(ax: Any, data: dict[str, Any]) -> str | None:
    samples, decisions = data["samples"], data["autoscale"]
    if not samples and not decisions:
        return (
            f"No GPU memory data for this run: no GPU samples in {data['samples_path']} (framefleet run "
            "writes them where it sees a GPU) and no autoscaler decisions in Redis (ff:autoscale)."
        )
    t0 = float(data["summary"].get("started") or 0)
    unit, label = time_axis(data["summary"])
    for gpu in sorted({int(s["gpu"]) for s in samples}):
        mine = [s for s in samples if int(s["gpu"]) == gpu]
        ax.plot([(s["time"] - t0) / unit for s in mine], [s["used_mib"] / 1024 for s in mine], label=f"GPU {gpu}")
    for action, (marker, color) in MARKERS.items():
        chosen = [d for d in decisions if d.get("action") == action and d.get("used_mib") is not None]
        if chosen:
            ax.scatter(
                [(d["time"] - t0) / unit for d in chosen],
                [d["used_mib"] / 1024 for d in chosen],
                marker=marker,
                color=color,
                s=60,
                zorder=3,
                label=f"autoscaler: {action}",
            )
        for d in (d for d in decisions if d.get("action") == action):
            ax.axvline((d["time"] - t0) / unit, color=color, alpha=0.3, linestyle="--")
    ax.set(xlabel=label, ylabel="GiB used", title="GPU memory and autoscaler decisions")
    ax.legend(loc="best", fontsize="small")
    return None


def plot_durations(ax: Any, data: dict[str, Any]) -> str | None:
    spans = {
        s: [
            e["end"] - e["start"] for e in data["stage_log"] if e["stage"] == s and e.get("ok") and not e.get("skipped")
        ]
        for s in STAGE_NAMES
    }
    stages = [s for s in STAGE_NAMES if spans[s]]
    if stages:
        ax.boxplot([spans[s] for s in stages], tick_labels=stages)
        ax.set(ylabel="seconds per task", title="Stage durations (stage log)")
        return None
    means = {s: v["mean_s"] for s, v in data["summary"].get("stages", {}).items() if "mean_s" in v}
    if not means:
        return "No stage ran in this run (every output was already complete), so there are no durations."
    ax.bar(list(means), list(means.values()))
    ax.set(ylabel="mean seconds per task", title="Stage durations (means from run_summary.json; no stage log)")
    return None


def plot_failures(ax: Any, data: dict[str, Any]) -> str | None:
    classes = Counter(f"{f['error_class']} ({f['stage']})" for f in data["summary"].get("failed", []))
    if not classes:
        return "No video failed in this run."
    ax.barh(list(classes), list(classes.values()))
    ax.set(xlabel="videos", title="Failures by class (stage)")
    return None


def build(out: Path, conf: Settings, table: tuple[list[dict[str, Any]], int] | None = None) -> Path:
    """Write OUT/report.html and its plots; return the HTML's path. ``table``: the quality table's videos and
    count (``report_quality.recorded``'s), when the run's end found them already. Raises FileNotFoundError
    without a summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load(out, conf)
    folder = out / "report"
    sections = []
    plots = [
        ("Throughput", "throughput", lambda ax: plot_throughput(ax, out, data)),
        ("GPU memory", "gpu_memory", lambda ax: plot_gpu_memory(ax, data)),
        ("Stage durations", "stage_durations", lambda ax: plot_durations(ax, data)),
        ("Failures", "failures", lambda ax: plot_failures(ax, data)),
    ]
    for title, name, draw in plots:
        fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
        try:
            missing = draw(ax)
            if missing is None:
                fig.tight_layout()
                fig.savefig(folder / f"{name}.png")
                body = f'<img src="report/{name}.png" alt="{html.escape(title)}">'
            else:
                (folder / f"{name}.png").unlink(missing_ok=True)
                body = f'<p class="missing">{html.escape(missing)}</p>'
        finally:
            plt.close(fig)
        sections.append(f"<h2>{html.escape(title)}</h2>\n{body}")
    from tasks.report.report_quality import section

    sections.insert(0, section(out, table))
    path = out / "report.html"
    path.write_text(page(data, sections))
    return path


def _caught(counts: dict[str, int] | None) -> str:
    """What each gate kept out, as "quality.<setting>: N videos; ..." (a summary before it: "not recorded")."""
    if counts is None:
        return "not recorded"
    return "; ".join(f"{gate}: {n} video{'s' * (n != 1)}" for gate, n in counts.items()) or "nothing"


def page(data: dict[str, Any], sections: list[str]) -> str:
    s = data["summary"]
    rows = [
        ("Run", s["run_id"]),
        ("Videos", s["videos"]),
        ("Done", s["done"]),
        ("Already complete", s.get("already_complete", 0)),
        ("Failed", len(s.get("failed", []))),
        ("Quarantined", len(s.get("quarantined", []))),
        ("Kept out by the gates", _caught(s.get("gates_caught"))),
        ("Wall time", f"{s['wall_s']:.1f} s" if s.get("wall_s") is not None else "unknown"),
        ("Started", _when(s.get("started"))),
        ("Finished", _when(s.get("finished"))),
        ("Stage log and decisions from", data["source"]),
        ("GPU samples", f"{len(data['samples'])} from {data['samples_path']}"),
    ]
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>framefleet run {html.escape(s["run_id"])}</title>
<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}th{{text-align:left;padding-right:1em}}
img{{max-width:100%}}.missing{{color:#555;font-style:italic}}.quality td{{vertical-align:top;font-size:90%}}
.low{{background:#fde8e8}}</style></head>
<body><h1>framefleet run {html.escape(s["run_id"])}</h1>
<table>
{table}
</table>
{chr(10).join(sections)}
<p>Files: <a href="run_summary.json">run_summary.json</a>,
<a href="normalization_stats.yaml">normalization_stats.yaml</a>, <a href="quarantine.jsonl">quarantine.jsonl</a>.</p>
</body></html>
"""


def _when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "unknown"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=_cli.HelpFormatter)
    parser.add_argument("out", type=Path, metavar="OUT", help="a run's output folder")
    parser.add_argument(
        "--table",
        type=argparse.FileType("r"),
        help="the quality table's videos and count as JSON ({videos, count}, or null; - for standard input, "
        "read before the summary), as the run's end found them; without it (or null) they are read from the "
        "manifest and the runs' outcomes",
    )
    _cli.add_config_argument(parser)
    args = parser.parse_args(argv)
    # The run's own Redis (tasks.run.own_redis) while it lasts, for its stage log; the files otherwise.
    conf, _ = _cli.settings_for_run(args, args.out, runs.latest(args.out))
    table = None
    if args.table is not None:
        import matplotlib  # before the wait: the run's end starts this process early, for this

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401

        text = args.table.read()
        if not text.strip():
            return _cli.fail("no quality table was given (the run's end stopped before its summary)", code=3)
        given = json.loads(text)
        table = (given["videos"], int(given["count"])) if given is not None else None
    try:
        path = build(args.out, conf, table)
    except FileNotFoundError as exc:
        return _cli.fail(f"no run summary in {args.out} ({exc.filename}): report on a finished run's output folder")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

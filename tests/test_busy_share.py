"""The strict GPU busy measure (bench/busy_share.py): the share over the window and where the idle time went."""

from __future__ import annotations

import json

import pytest

from bench.busy_share import busy, main, read_samples


def points(*spans: tuple[float, float, float], hz: float = 4.0) -> list[tuple[float, float]]:
    """Samples at ``hz`` from 0 s: each span (from s, to s, util %) sets the samples whose interval lies in it."""
    out, t = [(0.0, 0.0)], 0.0
    end = max(b for _, b, _ in spans)
    while t < end:
        t = round(t + 1 / hz, 6)
        out.append((t, next((u for a, b, u in spans if a < t <= b), 0.0)))
    return out


def test_idle_splits_into_start_handoffs_and_tail():
    # idle 0-2 s, busy 2-10 s with one idle second at 5-6 s, busy to 12 s, idle 12-13 s
    samples = points((0, 2, 0), (2, 5, 100), (5, 6, 0), (6, 12, 100), (12, 13, 0))
    b = busy(samples, 0.0, 13.0)
    assert (b.window_s, b.busy_s, b.share) == (13.0, 9.0, round(9 / 13, 4))
    assert (b.start_s, b.handoffs_s, b.tail_s) == (2.0, 1.0, 1.0)
    assert b.hz == 4.0


def test_partial_utilisation_counts_its_share_and_the_window_clips():
    samples = points((0, 10, 80))
    b = busy(samples, 2.0, 6.0)
    assert b.busy_s == pytest.approx(3.2)
    assert b.share == pytest.approx(0.8)
    assert b.start_s + b.handoffs_s + b.tail_s == pytest.approx(0.8)


def test_a_window_the_samples_do_not_cover_is_refused():
    with pytest.raises(ValueError, match="do not cover the window"):
        busy(points((0, 5, 100)), 1.0, 6.0)
    with pytest.raises(ValueError, match="is empty"):
        busy(points((0, 5, 100)), 3.0, 3.0)


def test_never_busy_is_all_start():
    b = busy(points((0, 4, 10)), 0.0, 4.0)
    assert (b.start_s, b.handoffs_s, b.tail_s) == (pytest.approx(3.6), 0.0, 0.0)


def test_report_reads_the_window_from_the_run_summary(tmp_path, capsys):
    samples = points((0, 1, 0), (1, 9, 100), (9, 10, 0))
    rows = [f"{1000 + t:.3f}, {g}, {u:.0f}, 4000" for t, u in samples for g in (0, 1)]
    (tmp_path / "s.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "run_summary.json").write_text(json.dumps({"started": 1000.0, "finished": 1010.0}))
    assert len(read_samples(tmp_path / "s.csv", 1)) == 41
    argv = ["report", str(tmp_path / "s.csv"), str(tmp_path / "run_summary.json"), "--gpus", "0,1"]
    assert main([*argv, "--json", str(tmp_path / "b.json")]) == 0
    assert "GPU 1: busy share 0.800 over 10.0 s" in capsys.readouterr().out
    assert [b["tail_s"] for b in json.loads((tmp_path / "b.json").read_text())] == [1.0, 1.0]

"""The run summary's per-video parts added one outcome at a time (tasks.run.tally): the counts, failures,
per-stage durations and gaps, and backend sets that run_summary.json reports."""

from __future__ import annotations

import pytest


def span(start: float, end: float, worker: str = "w1", skipped: bool = False) -> dict:
    return {"start": start, "end": end, "worker": worker, "skipped": skipped, "run_s": end - start}


def test_a_tally_of_outcomes_gives_the_summarys_stage_timings_failures_and_backends():
    from tasks.run.tally import Tally

    tally = Tally("run", ["a", "b", "c"])
    made = {"provenance": {"backends": {"a": "x", "b": "builtin"}}, "quality": {"q": 1}}
    assert tally.add({"video_id": "v1", "timings": {"a": span(0, 1), "b": span(1.5, 3.5, "w2")}, "report": made}) == (
        "v1",
        "done",
        made,
    )
    tally.add({"video_id": "v2", "timings": {"a": span(10, 14), "b": span(14, 15, skipped=True)}, "report": made})
    tally.add({"video_id": "v3", "timings": {"b": span(20, 21)}, "notes": {"n": "x"}, "report": {}})
    failure = {"stage": "b", "error_class": "low_quality", "reason": "r", "attempts": 1, "worker": "w", "time": 1.0}
    low = tally.add({"video_id": "v4", "video": "v4.mp4", "failed": {**failure, "detail": {"shortfalls": ["s"]}}})
    other = tally.add({"video_id": "v5", "video": "v5.mp4", "failed": {**failure, "error_class": "Boom"}})
    assert low == ("v4", "low_quality", {"shortfalls": ["s"]}) and other == ("v5", "failed", {})

    assert tally.videos == 5 and tally.done == ["v1", "v2", "v3"] and tally.notes == {"v3": {"n": "x"}}
    assert [f["video_id"] for f in tally.failed] == ["v4", "v5"] and tally.failed[1]["error_class"] == "Boom"
    assert tally.low == {"v4": {"shortfalls": ["s"]}} and tally.backends() == {"a": "x", "b": "builtin"}
    timings = tally.stage_timings()
    assert timings["a"] == {"tasks": 2, "skipped": 0, "workers": {"w1": 2}, "mean_s": 2.5, "max_s": 4.0, "total_s": 5.0}
    b = timings["b"]
    assert (b["tasks"], b["skipped"], b["workers"]) == (3, 1, {"w2": 1, "w1": 2})
    assert (b["mean_s"], b["max_s"], b["total_s"]) == (1.5, 2.0, 3.0)
    assert b["overhead_after_a"] == {"mean_s": pytest.approx(0.25), "max_s": 0.5}  # v3 had no stage a: no gap
    assert timings["c"] == {"tasks": 0, "skipped": 0, "workers": {}}


def test_the_runs_counters_give_the_figures_of_a_tally_of_its_outcomes():
    """What each video adds to its run's counters as it finishes (``counts``), summed in any order, gives the
    summary's stage timings and backends that a tally of the whole outcomes gives (times kept to the ms). The
    counters are whole microseconds, exact; the tally subtracts epoch seconds in float64, whose spacing near
    1.7e9 s is 2.4e-7 s: they agree far below the millisecond the outcomes keep."""
    import random
    from collections import Counter

    from tasks.run.tally import Tally, counts

    stages = ["a", "b", "c"]
    rng = random.Random(5)
    outcomes = []
    for i in range(300):
        t, timings = round(1.7e9 + rng.uniform(0, 1e5), 3), {}  # outcomes keep times to the ms
        for stage in stages:
            if rng.random() < 0.9:
                took = round(rng.uniform(0.001, 30.0), 3)
                timings[stage] = span(t, round(t + took, 3), f"w{rng.randrange(3)}", skipped=rng.random() < 0.1)
                t = round(t + took + rng.uniform(-0.5, 2.0), 3)
        backends = {"a": "x", "b": rng.choice(["builtin", "y"])}
        outcomes.append({"video_id": f"v{i}", "timings": timings, "report": {"provenance": {"backends": backends}}})
    whole = Tally("run", stages)
    for outcome in outcomes:
        whole.add(outcome)
    summed: Counter[str] = Counter()
    most: dict[str, int] = {}
    for outcome in rng.sample(outcomes, len(outcomes)):  # any order
        add, raise_to = counts(outcome, stages)
        summed.update(add)
        for name, value in raise_to.items():
            most[name] = max(most.get(name, value), value)
    counted = Tally("run", stages)
    counted.add_counts({**summed, **most}, [], {})
    assert counted.videos == whole.videos == 300 and counted.backends() == whole.backends()
    got, want = counted.stage_timings(), whole.stage_timings()
    assert got.keys() == want.keys()
    for stage in stages:
        g, w = got[stage], want[stage]
        assert g.keys() == w.keys() and (g["tasks"], g["skipped"], g["workers"]) == (
            w["tasks"],
            w["skipped"],
            w["workers"],
        )
        for name in ("mean_s", "max_s", "total_s"):  # a total: a spacing's error per span
            near = 1e-6 * (w["tasks"] if name == "total_s" else 1)
            assert g[name] == pytest.approx(w[name], rel=0, abs=near), (stage, name)
        gap = "overhead_after_" + stages[stages.index(stage) - 1]
        if gap in w:
            assert g[gap] == pytest.approx(w[gap], rel=0, abs=1e-6), (stage, gap)


def test_the_runs_counters_keep_stage_times_and_gaps_to_the_microsecond():
    """run_summary.json's ``overhead_after_*`` and stage times from a run's counters are exact to the µs (a
    transition costs a few ms: whole ms hid a 1 ms change); a run counted by an earlier version, in ms, still reads."""
    from tasks.run.tally import Tally, counts

    t = 1_764_000_000.0
    outcome = {"video_id": "v", "timings": {"a": span(t, t + 0.5), "b": span(t + 0.501234, t + 0.75)}}
    add, most = counts(outcome, ["a", "b"])
    assert add["s:b:gap_us"] == most["s:b:gap_max_us"] == 1234 and add["s:a:us"] == 500_000
    now = Tally("run", ["a", "b"])
    now.add_counts({**add, **most}, [], {})
    b = now.stage_timings()["b"]
    assert b["overhead_after_a"] == {"mean_s": 0.001234, "max_s": 0.001234}
    assert (b["mean_s"], b["max_s"]) == (0.248766, 0.248766)

    earlier = Tally("run", ["a", "b"])
    fields = {"done": 1, "s:b:tasks": 1, "s:b:ran": 1, "s:b:ms": 249, "s:b:max": 249}
    earlier.add_counts({**fields, "s:b:gaps": 1, "s:b:gap_ms": 1, "s:b:gap_max": 1}, [], {})
    b = earlier.stage_timings()["b"]
    assert b["overhead_after_a"] == {"mean_s": 0.001, "max_s": 0.001} and (b["mean_s"], b["max_s"]) == (0.249, 0.249)

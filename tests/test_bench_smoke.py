"""The benchmarks kept in bench/ still run: each states what it measures and starts; the CPU ones run small.

A benchmark that no test starts rots silently when the code it drives moves (tasks/run was split by
concern: a bench importing an old path would fail only when someone next measured). The GPU benches
cannot run here; their Python parts are started with ``--help`` (which imports the module) and their
shell drivers are parsed by bash.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "bench"
PY_BENCHES = sorted(p.name for p in BENCH.glob("*.py"))
SH_BENCHES = sorted(p.name for p in BENCH.glob("*.sh"))


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT), "FRAMEFLEET_DEFAULT_BACKENDS": "synthetic"}


@pytest.mark.parametrize("name", PY_BENCHES)
def test_a_python_benchmark_says_what_it_measures_and_starts(name: str) -> None:
    path = BENCH / name
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and len(doc.split()) >= 5, f"bench/{name} needs a header docstring saying what it measures"
    if '__name__ == "__main__"' in path.read_text():
        command = [sys.executable, str(path), "--help"]
    else:  # a part another bench imports (bench/scale.py's live_run, simulated, ...): importing it is its start
        command = [sys.executable, "-c", f"import runpy; runpy.run_path({str(path)!r}, run_name='bench_part')"]
    done = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"bench/{name} failed to start:\n{done.stderr[-2000:]}"
    if command[-1] == "--help":
        assert "usage" in done.stdout.lower(), f"bench/{name} --help printed no usage: {done.stdout[:300]!r}"


@pytest.mark.parametrize("name", SH_BENCHES)
def test_a_shell_benchmark_has_a_header_and_parses(name: str) -> None:
    path = BENCH / name
    lines = path.read_text().splitlines()
    header = [line for line in lines[:6] if line.startswith("# ")]
    assert header, f"bench/{name} needs a '# ' header in its first lines saying what it measures"
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"bench/{name} does not parse: {done.stderr}"


def test_the_orchestration_benchmark_runs_its_baseline_on_a_real_video(
    tmp_path: Path, video_factory: Callable[..., Path]
) -> None:
    raw = video_factory(1)
    result = tmp_path / "compare.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), str(raw), "--work", str(tmp_path / "work")]
        + ["--modes", "sequential", "--rounds", "1", "--json", str(result)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(result.read_text())
    assert row["mode"] == "sequential" and row["ok"]
    assert set(row["stages"]) == {"preprocess", "depth", "tracks", "hands", "h5"}
    assert all(stage["tasks"] == 1 for stage in row["stages"].values())


def test_the_chain_policy_simulation_runs_and_compares() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "chain_policy_sim.py"), "--videos", "4"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "finish:" in done.stdout and "before" in done.stdout


def test_the_formats_benchmark_measures_every_format_on_a_small_case(tmp_path: Path) -> None:
    result = tmp_path / "formats.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "formats.py"), "--videos", "600", "--redis-videos", "200"]
        + ["--work", str(tmp_path / "work"), "--json", str(result)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(result.read_text())["rows"]
    assert {row["format"] for row in rows} == {"outcomes", "manifest", "partials", "pending", "outcomes@r"}
    assert all(row["s"] is not None or row["bytes"] is not None for row in rows)

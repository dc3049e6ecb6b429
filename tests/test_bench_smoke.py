"""The benchmarks kept in bench/ still run: each states what it measures and starts; the CPU ones run small.

A benchmark that no test starts rots silently when the code it drives moves (tasks/run was split by
concern: a bench importing an old path would fail only when someone next measured). The GPU benches
cannot run here; their Python parts are started with ``--help`` (which imports the module) and their
shell drivers are parsed by bash. What the GPU drivers share (bench/gpu_lib.sh: the environment, the upstream
sources at their pins, the clips) runs here, in a copy of the repository with nothing beside it.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tarfile
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
    else:  # a part another bench imports (bench/modes_local.py, rawchain.py, ...): importing it is its start
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


BARE_IGNORE = shutil.ignore_patterns(".venv", ".git", ".device", ".gpu", "__pycache__", "*.egg-info", ".*_cache")


@pytest.fixture
def bare_repo(tmp_path: Path) -> Path:
    """A copy of the repository as an operator has it: no shared folder beside it, no .device, no .venv."""
    repo = tmp_path / "host" / "framefleet"
    shutil.copytree(ROOT, repo, ignore=BARE_IGNORE)
    return repo


def _gpu_lib(repo: Path, script: str, path: list[Path], **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in bash after sourcing bench/gpu_lib.sh, with only PATH, HOME and ``env`` set."""
    run_env = {"PATH": ":".join([*map(str, path), "/usr/bin", "/bin"]), "HOME": str(repo.parent), **env}
    command = ["bash", "-c", f"source bench/gpu_lib.sh; {script}"]
    return subprocess.run(command, cwd=repo, env=run_env, capture_output=True, text=True, timeout=120)


def _pin(repo: Path, name: str) -> str:
    return _gpu_lib(repo, f"pin {name}", []).stdout.split()[1]


def _archive(folder: Path, name: str, commit: str) -> Path:
    """A source snapshot as bench/gpu_carry.sh carries them: NAME.tar.gz holding NAME/ with .upstream-commit."""
    tree = folder / "tree" / name
    tree.mkdir(parents=True)
    (tree / ".upstream-commit").write_text(commit + "\n")
    (tree / "predictor.py").write_text("WINDOW = 60\n")
    (folder / "archives").mkdir(exist_ok=True)
    with tarfile.open(folder / "archives" / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(tree, arcname=name)
    return folder / "archives"


def test_upstream_unpacks_the_named_archive_and_says_when_it_is_not_at_the_pin(bare_repo: Path, tmp_path: Path) -> None:
    name = "facebookresearch+co-tracker"
    archives = _archive(tmp_path / "at-pin", name, _pin(bare_repo, name))
    env = {"UPSTREAM_ARCHIVES": str(archives), "UPSTREAM_DIR": str(tmp_path / "up")}
    done = _gpu_lib(bare_repo, f"upstream {name}", [], **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "up" / name)
    assert (tmp_path / "up" / name / "predictor.py").read_text() == "WINDOW = 60\n"
    assert done.stderr == ""

    archives = _archive(tmp_path / "elsewhere", name, "0" * 40)
    env = {"UPSTREAM_ARCHIVES": str(archives), "UPSTREAM_DIR": str(tmp_path / "up2")}
    done = _gpu_lib(bare_repo, f"upstream {name}", [], **env)
    assert done.returncode == 0, done.stderr
    assert "0000000000" in done.stderr and _pin(bare_repo, name) in done.stderr, done.stderr


def test_upstream_clones_the_pinned_commit_and_without_archive_or_network_names_the_fix(
    bare_repo: Path, tmp_path: Path
) -> None:
    name = "facebookresearch+co-tracker"
    done = _gpu_lib(
        bare_repo, f"upstream {name}", [], UPSTREAM_DIR=str(tmp_path / "up"), UPSTREAM_GIT_BASE=str(tmp_path / "none")
    )
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "git clone" in line and "UPSTREAM_ARCHIVES" in line and "gpu_carry.sh up" in line, line
    assert not (tmp_path / "up" / name).exists()

    # a reachable repository (a local one stands for GitHub): the pinned commit is checked out, not its newest
    origin = tmp_path / "git" / "facebookresearch" / "co-tracker"
    origin.mkdir(parents=True)
    git = ["git", "-C", str(origin), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(origin)], check=True)
    (origin / "predictor.py").write_text("WINDOW = 60\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "pinned"], check=True)
    pinned = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (origin / "predictor.py").write_text("WINDOW = 16\n")
    subprocess.run([*git, "commit", "-qam", "later"], check=True)
    script = f"COTRACKER_COMMIT={pinned}; upstream {name}"
    done = _gpu_lib(bare_repo, script, [], UPSTREAM_DIR=str(tmp_path / "up"), UPSTREAM_GIT_BASE=str(tmp_path / "git"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "up" / name)
    assert (tmp_path / "up" / name / "predictor.py").read_text() == "WINDOW = 60\n"
    assert (tmp_path / "up" / name / ".upstream-commit").read_text().strip() == pinned


def test_clip_falls_back_to_a_synthetic_clip_that_decodes(bare_repo: Path, tmp_path: Path) -> None:
    import av

    env = {"CLIP_DIR": str(tmp_path / "clips"), "CLIP_S": "1"}
    done = _gpu_lib(bare_repo, "clip dog", [Path(sys.executable).parent], **env)
    assert done.returncode == 0, done.stderr
    assert "synthetic" in done.stderr
    with av.open(done.stdout.strip()) as container:
        assert sum(1 for _ in container.decode(video=0)) >= 15

    real = tmp_path / "real"
    real.mkdir()
    shutil.copy(done.stdout.strip(), real / "dog.mp4")
    done = _gpu_lib(bare_repo, "clip dog", [], FRAMEFLEET_REAL_DATA=str(real), **env)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, str(real / "dog.mp4"), "")


def test_gpu_env_without_celery_fails_in_one_line_naming_the_fix(bare_repo: Path, tmp_path: Path) -> None:
    bare_python = tmp_path / "bare-python"  # an interpreter with the standard library only
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare_python)], check=True, timeout=60)
    done = _gpu_lib(bare_repo, "gpu_env && echo ready", [bare_python / "bin"])
    assert done.returncode == 1 and "ready" not in done.stdout
    (line,) = done.stderr.splitlines()
    assert "celery" in line and "make install" in line, line


def test_every_performance_row_names_a_command_that_is_here_or_the_commit_that_holds_it() -> None:
    """docs/performance.md's command column: a script in bench/ today, or one named "at <commit>" (git keeps it)."""
    commands, in_claims = [], False
    for line in (ROOT / "docs" / "performance.md").read_text().splitlines():
        in_claims = line.startswith("| claim") or (in_claims and line.startswith("|"))  # the claims tables only
        if in_claims and not line.startswith(("| claim", "|---")):
            commands.append(line.split(" | ")[3])
    assert len(commands) >= 20, commands
    for command in commands:
        if command.startswith("at "):
            assert re.fullmatch(r"[0-9a-f]{7,40}", command.split()[1].rstrip(":")), command
            continue
        for word in command.split("(the figure:")[0].split():
            script = word.strip("`();,")
            if script.startswith("bench/"):
                assert (ROOT / script).is_file(), f"performance.md runs {script}, not in bench/: {command}"

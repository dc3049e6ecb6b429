"""The model environments' locks (deploy/envs/<model>.lock): complete, agreeing with their inputs, and current.

The offline tests read the committed files. ``test_lock_is_current`` (marker ``registry``) resolves
every lock's inputs again through deploy/envs/lock.sh and fails when the result differs, so a pin
that drifts from its inputs fails CI; it skips, saying so, only when PyPI cannot be reached.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import skip_unless_ci

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "deploy" / "envs"
MODELS = ["cotracker", "grounded_sam", "sam3", "tapip3d", "vipe", "wilor"]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;#]+)")


def pins(lock_text: str) -> dict[str, str]:
    """The lock's `name==version` lines as {canonical name: version}."""
    found = {}
    for line in lock_text.splitlines():
        m = PIN.match(line.strip())
        if m:
            found[canonicalize_name(m.group(1))] = m.group(3)
    return found


def drift(committed: str, resolved: str) -> list[str]:
    """What differs between two locks' pins: one line per package added, removed or changed."""
    old, new = pins(committed), pins(resolved)
    names = sorted(old.keys() | new.keys())
    return [f"{n}: {old.get(n, 'absent')} -> {new.get(n, 'absent')}" for n in names if old.get(n) != new.get(n)]


def test_every_model_has_inputs_and_a_lock_that_names_how_to_remake_it() -> None:
    build = (ENVS / "build.sh").read_text()
    lock_sh = (ENVS / "lock.sh").read_text()
    for model in MODELS:
        assert f"build_{model}()" in build, f"build.sh has no build_{model}"
        assert model in lock_sh, f"lock.sh does not lock {model}"
        lock = (ENVS / f"{model}.lock").read_text()
        assert f"bash deploy/envs/lock.sh {model}" in lock.splitlines()[1], f"{model}.lock was not made by lock.sh"
        assert (ENVS / f"{model}.in").is_file()


@pytest.mark.parametrize("model", MODELS)
def test_lock_keeps_the_inputs_exact_pins_and_framefleets_requirements(model: str) -> None:
    locked = pins((ENVS / f"{model}.lock").read_text())
    for line in (ENVS / f"{model}.in").read_text().splitlines():
        m = PIN.match(line.strip())
        if m:
            name = canonicalize_name(m.group(1))
            got = locked.get(name)
            assert got == m.group(3), f"{model}.in pins {name}=={m.group(3)}, the lock has {got}"
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        version = locked.get(canonicalize_name(req.name))
        assert version is not None, f"{model}.lock lacks framefleet's {req.name}: run bash deploy/envs/lock.sh {model}"
        assert req.specifier.contains(version, prereleases=True), (
            f"{model}.lock has {req.name}=={version}, framefleet needs {req.specifier}: "
            f"run bash deploy/envs/lock.sh {model}"
        )


def test_drift_names_every_changed_package() -> None:
    committed = "a==1.0\n    # via x\nb==2.0\nc[extra]==3.0\n"
    resolved = "a==1.1\nc[extra]==3.0\nd==4.0\n"
    assert drift(committed, resolved) == ["a: 1.0 -> 1.1", "b: 2.0 -> absent", "d: absent -> 4.0"]
    assert drift(committed, committed) == []


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


def uv_binary() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("uv is not installed: it is in the test extra, pip install -e '.[test]' (or uv==0.13.8)")
    return found


@pytest.mark.registry
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", MODELS)
def test_lock_is_current(model: str, tmp_path: Path) -> None:
    if not pypi_reachable():
        # A machine without the network cannot resolve a lock; CI's can, so there a drift never passes unseen.
        skip_unless_ci("pypi.org:443 cannot be reached from here: the locks were not re-resolved")
    env = {**os.environ, "LOCK_DIR": str(tmp_path), "UV": uv_binary()}
    done = subprocess.run(["bash", str(ENVS / "lock.sh"), model], env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"lock.sh {model} could not resolve its inputs:\n{done.stderr[-3000:]}"
    changed = drift((ENVS / f"{model}.lock").read_text(), (tmp_path / f"{model}.lock").read_text())
    assert not changed, (
        f"deploy/envs/{model}.lock is not what its inputs resolve to now: {changed}. "
        f"Run bash deploy/envs/lock.sh {model} and commit the lock."
    )

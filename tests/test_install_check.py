"""An install without MediaPipe (`pip install -e .`): `framefleet run` with no config refuses in one line before
starting any worker, naming the command that installs it; a worker whose backend cannot load is not restarted."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tasks.autoscaler.supervisor import Supervisor
from tasks.cli import install_backends
from tasks.errors import EXIT_CANNOT_START
from tests.conftest import ROOT

# A site hook that makes MediaPipe uninstalled for the processes that load it, as in an environment without it.
HIDE_MEDIAPIPE = """
import sys


class _Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "mediapipe" or name.startswith("mediapipe."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Uninstalled())
"""


def test_run_without_mediapipe_refuses_in_one_line_before_any_worker_naming_the_install_command(
    video_factory, pipeline_env, tmp_path
):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE_MEDIAPIPE)
    env = {k: v for k, v in pipeline_env.items() if k != "FRAMEFLEET_DEFAULT_BACKENDS"}
    # A Redis that does not answer: a run that got past the install check stops at once naming it (exit 2, another
    # line), instead of starting workers that exit 3 and waiting for them.
    env["REDIS_URL"] = "redis://127.0.0.1:1/0"
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "run", str(video_factory(1)), "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("framefleet: stages.hands.backend is mediapipe, but mediapipe is not installed"), line
    assert "install it with `framefleet install-backends`" in line
    assert not (out / "logs").exists()  # no Redis, no worker was started


def test_install_backends_installs_the_real_extra_then_the_makefiles_mediapipe_without_its_dependencies():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^MEDIAPIPE \?= {re.escape(install_backends.MEDIAPIPE)}$", makefile, re.M)
    first, second = install_backends.commands("/env/bin/python")
    assert first[:4] == ["/env/bin/python", "-m", "pip", "install"] and any(r.startswith("protobuf") for r in first)
    assert second == ["/env/bin/python", "-m", "pip", "install", "--no-deps", install_backends.MEDIAPIPE]


def test_a_worker_that_cannot_start_is_not_restarted(tmp_path):
    now = [0.0]
    sup = Supervisor(
        lambda gpu, name: [sys.executable, "-c", f"raise SystemExit({EXIT_CANNOT_START})"],
        lambda gpu: dict(os.environ),
        tmp_path,
        clock=lambda: now[0],
    )
    slot = sup.start(0, "gpu0")
    slot.proc.wait()
    ((what, _slot, detail),) = sup.reap()
    assert what == "exited" and "cannot start here" in detail and "not restarted" in detail
    now[0] += 3600
    assert sup.reap() == [] and slot.proc is None  # an hour on: still not restarted

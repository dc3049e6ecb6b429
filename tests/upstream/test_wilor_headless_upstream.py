"""pyrender as WiLoR imports it (wilor/utils/mesh_renderer.py:7), after the ``wilor`` adapter's choice of platforms.

pyrender's import subclasses ``pyglet.window.Window`` (pyrender/viewer.py:33-38); unless pyglet is
headless that loads X11's libraries, and on the GPU machine, which has none, the import failed
(docs/archive/notebook.md, "TAPIP3D and WiLoR through their upstream code on a GPU"). After
``headless_rendering()`` the real pyrender and pyglet (the versions of deploy/envs/wilor.lock) must
import with pyglet's EGL window and no X11 module, in a process with no display, and build the
``OffscreenRenderer`` that ``load_wilor`` builds (mesh_renderer.py:49-51) on the machine's EGL (on a
CPU, Mesa's: ``apt install libegl1 libegl-mesa0``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.upstream.sources import ROOT

pytestmark = [pytest.mark.upstream, pytest.mark.slow]  # needs [upstream]'s pyrender

SCRIPT = r"""
import json, os, sys
from tasks.backends.wilor import headless_rendering
headless_rendering()
import pyrender, pyglet
print(json.dumps({
    "window": pyglet.window.Window.__name__,
    "x11": sorted(m for m in sys.modules if m.startswith("pyglet.libs.x11") or m.startswith("pyglet.window.xlib")),
    "opengl_platform": os.environ["PYOPENGL_PLATFORM"],
}))
renderer = pyrender.OffscreenRenderer(viewport_width=256, viewport_height=256, point_size=1.0)  # WiLoR's
renderer.delete()
print(json.dumps({"offscreen": "built"}))
"""


def test_pyrender_imports_headless_after_the_adapters_choice():
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": "/tmp"},  # no DISPLAY
    )
    assert run.returncode == 0, run.stderr[-3000:]
    imported, built = (json.loads(line) for line in run.stdout.strip().splitlines()[-2:])
    assert imported["window"] == "HeadlessWindow" and imported["x11"] == []
    assert imported["opengl_platform"] == "egl" and built == {"offscreen": "built"}

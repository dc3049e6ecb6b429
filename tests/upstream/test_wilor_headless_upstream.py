"""pyrender as WiLoR imports it (wilor/utils/mesh_renderer.py:7), after the ``wilor`` adapter's choice of platforms.

pyrender's import subclasses ``pyglet.window.Window`` (pyrender/viewer.py:33-38); unless pyglet is
headless that loads X11's libraries, and on the GPU machine, which has none, the import failed
(bench/RESULTS.md, "TAPIP3D and WiLoR through their upstream code on a GPU"). After
``headless_rendering()`` the real pyrender and pyglet (the versions of deploy/envs/wilor.lock) must
import with pyglet's EGL window and no X11 module, in a process with no display.
"""

from __future__ import annotations

import pytest

from tests.upstream.sources import run_python

pytestmark = pytest.mark.upstream

SCRIPT = r"""
import json, os, sys
from tasks.backends.wilor import headless_rendering
headless_rendering()
import pyrender, pyglet
print(json.dumps({
    "window": pyglet.window.Window.__name__,
    "x11": sorted(m for m in sys.modules if m.startswith("pyglet.libs.x11") or m.startswith("pyglet.window.xlib")),
    "opengl_platform": os.environ["PYOPENGL_PLATFORM"],
    "offscreen": pyrender.OffscreenRenderer.__name__,
}))
"""


def test_pyrender_imports_headless_after_the_adapters_choice():
    res = run_python(SCRIPT, path=[], env={"DISPLAY": ""})
    assert res["window"] == "HeadlessWindow" and res["x11"] == []
    assert res["opengl_platform"] == "egl" and res["offscreen"] == "OffscreenRenderer"

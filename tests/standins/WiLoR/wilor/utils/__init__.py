"""Stand-in for WiLoR's ``wilor/utils``: ``recursive_to``, and the renderer import's platform needs.

Upstream's ``wilor/utils/__init__.py:4-6`` imports the renderers, which import pyrender
(wilor/utils/mesh_renderer.py:7); on a machine without a display pyrender's OpenGL needs a
headless platform (PYOPENGL_PLATFORM=egl or osmesa) chosen before that import, and pyrender's
viewer subclasses ``pyglet.window.Window`` at import (pyrender/viewer.py:33-38), which loads X11's
libraries unless pyglet is headless (PYGLET_HEADLESS, read at pyglet's import: pyglet/__init__.py:317-329).
Without them that import fails in pyglet's xrender module with an AttributeError (seen on the GPU
machine, docs/archive/notebook.md), which this stand-in raises too.
"""

from __future__ import annotations

import os

import torch

if os.environ.get("PYOPENGL_PLATFORM") not in ("egl", "osmesa"):
    raise ImportError(
        "pyrender (imported by wilor.utils) needs a display or PYOPENGL_PLATFORM=egl|osmesa; "
        f"PYOPENGL_PLATFORM is {os.environ.get('PYOPENGL_PLATFORM')!r}"
    )
if os.environ.get("PYGLET_HEADLESS") not in ("true", "TRUE", "True", "1"):
    raise AttributeError(
        "'NoneType' object has no attribute 'XRenderFindVisualFormat'"
    )  # pyglet/libs/x11/xrender.py:39


def recursive_to(x, target):
    if isinstance(x, dict):
        return {k: recursive_to(v, target) for k, v in x.items()}
    if isinstance(x, torch.Tensor):
        return x.to(target)
    if isinstance(x, list):
        return [recursive_to(i, target) for i in x]
    return x

"""The tracks stage's no-mask queries are TAPIP3D's ``get_grid_queries``, run from zbw001/TAPIP3D's own source.

``utils/inference_utils.py`` imports TAPIP3D's models (CUDA extensions), so the function is taken
from that file's source as it is and run with the module it uses for the grid
(``third_party/cotracker/model_utils.py``); the tracks stage must give the same queries.
"""

from __future__ import annotations

import ast

import numpy as np
import pytest

from tests.upstream.sources import source

pytestmark = pytest.mark.upstream


def upstream_get_grid_queries():
    import importlib.util

    import torch

    root = source("zbw001+TAPIP3D")
    spec = importlib.util.spec_from_file_location("tapip3d_model_utils", root / "third_party/cotracker/model_utils.py")
    assert spec is not None and spec.loader is not None
    model_utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model_utils)
    tree = ast.parse((root / "utils" / "inference_utils.py").read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_grid_queries"]
    namespace = {"torch": torch, "get_points_on_a_grid": model_utils.get_points_on_a_grid}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "inference_utils.py", "exec"), namespace)
    return namespace["get_grid_queries"]


def test_no_mask_queries_are_tapip3ds_grid_queries():
    import torch

    from tasks.stages.tracks import grid_queries

    get_grid_queries = upstream_get_grid_queries()
    rng = np.random.default_rng(0)
    depth = rng.uniform(0.3, 2.0, (384, 512)).astype(np.float32)
    depth[:60] = 0  # no depth there: dropped by both
    depth[200:210, 100:300] = -1
    K = np.array([[400.0, 0, 250.0], [0, 410.0, 190.0], [0, 0, 1]])
    E = np.eye(4)  # y2r's window pose at the window's first step (TAPIP3D's world = that camera)
    pixels, points = grid_queries(depth, K, 64)
    L = 3
    queries = get_grid_queries(
        grid_size=64,
        depths=torch.from_numpy(np.repeat(depth[None], L, axis=0)),
        intrinsics=torch.from_numpy(np.repeat(K[None], L, axis=0)).float(),
        extrinsics=torch.from_numpy(np.repeat(E[None], L, axis=0)).float(),
    ).numpy()
    assert queries.shape == (len(points), 4) and (queries[:, 0] == 0).all()
    np.testing.assert_allclose(points, queries[:, 1:], rtol=1e-5, atol=1e-5)

"""A model's load never reaches the network: a missing file is a start-up error naming it, also with no network at all.

The loads run in the stand-ins' venv inside a network namespace of their own (``unshare -n``: no
interface but loopback), so a download attempt would fail or hang instead of passing unnoticed.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch

from tests.backends.standin_env import ROOT, lay_out_upstream, standin_python
from tests.conftest import skip_unless_ci

LOAD = r"""
import json, sys
from tasks.backends import get_backend
from tasks.errors import ModelLoadError
stage, name, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    get_backend(stage, name, **params).load("cpu")
    print(json.dumps({"error": None}))
except ModelLoadError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def offline_load(stage: str, name: str, params: dict) -> str | None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        # A network namespace needs root (CI runs as root).
        skip_unless_ci("needs `unshare -n` (a network namespace, as root) to cut the network")
    run = subprocess.run(
        ["unshare", "-n", str(standin_python()), "-c", LOAD, stage, name, json.dumps(params)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])["error"]


def test_vipe_names_every_missing_file_and_where_it_goes(tmp_path):
    dirs = lay_out_upstream(tmp_path)
    cache = dirs["vipe"]
    geocalib = cache / "torch" / "hub" / "geocalib" / "pinhole.tar"
    moge = next(cache.glob("huggingface/hub/models--Ruicheng--moge-vitl/snapshots/*/model.pt"))
    geocalib.unlink()
    moge.unlink()
    error = offline_load("depth", "vipe", {"weights_dir": str(cache)})
    assert error is not None and "lacks 2 file(s)" in error, error
    assert str(geocalib) in error and "geocalib-pinhole.tar" in error  # where it goes, where it comes from
    assert "models--Ruicheng--moge-vitl/snapshots/*/model.pt" in error and "huggingface.co/Ruicheng/moge-vitl" in error
    assert "droid" not in error  # present, so not named


def test_vipe_loads_offline_when_its_cache_is_full(tmp_path):
    dirs = lay_out_upstream(tmp_path)
    assert offline_load("depth", "vipe", {"weights_dir": str(dirs["vipe"])}) is None


def test_tapip3d_pretrained_encoder_is_a_start_up_error_not_a_download(tmp_path):
    dirs = lay_out_upstream(tmp_path)
    ckpt = dirs["tapip3d"] / "checkpoints" / "tapip3d_final.pth"
    data = torch.load(ckpt, weights_only=False)
    data["cfg"]["model"]["encoder"]["pretrained"] = True  # TAPIP3D then calls torch.hub.load (cotracker_cnn.py:24-25)
    torch.save(data, ckpt)
    error = offline_load("tracks", "tapip3d", {"repo_dir": str(dirs["tapip3d"])})
    assert error is not None and "torch.hub.load('facebookresearch/co-tracker', 'cotracker3_offline')" in error
    assert "facebookresearch_co-tracker_main" in error and "never downloads" in error


def test_hub_downloads_use_the_cache_or_name_the_file(tmp_path):
    from tasks.backends.upstream import no_downloads
    from tasks.errors import ModelLoadError

    url = "https://example.invalid/weights/model.pth"
    with no_downloads(), pytest.raises(ModelLoadError, match=str(tmp_path / "model.pth")):
        torch.hub.load_state_dict_from_url(url, model_dir=str(tmp_path))
    torch.save({"w": torch.ones(2)}, tmp_path / "model.pth")
    with no_downloads():
        assert torch.equal(torch.hub.load_state_dict_from_url(url, model_dir=str(tmp_path))["w"], torch.ones(2))
    with no_downloads(), pytest.raises(ModelLoadError, match="never downloads"):
        torch.hub.download_url_to_file(url, str(tmp_path / "other.pth"))
    assert torch.hub.load_state_dict_from_url.__module__ == "torch.hub"  # restored after the block

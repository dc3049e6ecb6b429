"""A throwaway venv with the upstream stand-ins installed, and folders laid out as the real checkouts and weights are.

The venv sees this project's environment through a ``.pth`` file (so torch, celery and the
project come from ``.venv``) and holds the stand-in packages in its own site-packages, which
come first. It is cached under the temp folder, keyed by a hash of the stand-in sources.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import torch

from tasks.backends.vipe_files import needed_files

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "tests" / "standins"
# ViPE's lyra pipeline as y2r composes it (field-of-view bounds, so GeoCalib runs).
LYRA = {
    "slam": {"keyframe_depth": "moge"},
    "init": {"camera_type": "pinhole", "fixed_fov_degrees": None, "instance": {"add_sky": True}},
    "post": {"depth_align_model": "adaptive_moge_vda"},
}


def _digest() -> str:
    h = hashlib.sha256(sys.executable.encode())
    for path in sorted((STANDINS / "site").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(STANDINS)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def venv_over_this_python(folder: Path, paths: Sequence[Path] = (), lines: Sequence[str] = ()) -> Path:
    """Make ``folder`` a venv (anew) that sees this interpreter's packages, then ``paths``, then runs ``lines``
    at start-up; return its purelib folder (packages copied there come first). Its python is folder/bin/python.
    """
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    purelib = Path(
        subprocess.run(
            [str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_paths()["purelib"]]
    # addsitedir (not a bare path) so the project's editable install and its .pth files apply too.
    (purelib / "zz-framefleet-project.pth").write_text(
        "".join(f"import site; site.addsitedir({str(p)!r})\n" for p in [*ours, *paths])
        + "".join(f"{line}\n" for line in lines)
    )
    return purelib


def standin_python() -> Path:
    """Return the interpreter of the stand-ins' venv, building it once per version of the stand-ins."""
    folder = Path(tempfile.gettempdir()) / f"framefleet-standins-{_digest()}"
    python = folder / "bin" / "python"
    if (folder / ".ready").exists():
        return python
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / ".ready").exists():
            return python
        purelib = venv_over_this_python(
            folder,
            lines=[
                # The vipe stand-in refuses a CPU as ViPE does, except here, where the chain tests run it on one.
                "import os; os.environ.setdefault('FRAMEFLEET_STANDIN_VIPE_CPU', '1')",
                # So does the sam3 stand-in, as SAM 3's video predictor does.
                "import os; os.environ.setdefault('FRAMEFLEET_STANDIN_SAM3_CPU', '1')",
            ],
        )
        for package in (STANDINS / "site").iterdir():
            if package.is_dir():
                shutil.copytree(package, purelib / package.name, ignore=shutil.ignore_patterns("__pycache__"))
        (folder / ".ready").touch()
    return python


def lay_out_upstream(base: Path) -> dict[str, Path]:
    """Make the checkouts (from the stand-ins) and weight, cache and MANO files under ``base``; return the folders."""
    tapip3d = base / "TAPIP3D"
    wilor = base / "WiLoR"
    shutil.copytree(STANDINS / "TAPIP3D", tapip3d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(STANDINS / "WiLoR", wilor, ignore=shutil.ignore_patterns("__pycache__"))
    vipe = base / "vipe-cache"
    for needed in needed_files(LYRA):
        f = vipe / needed.path.replace("*", "0" * 40)
        f.parent.mkdir(parents=True, exist_ok=True)
        torch.save({}, f)  # ViPE's loaders unpickle them
    tapip3d_ckpt = tapip3d / "checkpoints" / "tapip3d_final.pth"
    tapip3d_ckpt.parent.mkdir(parents=True)
    # TAPIP3D's layout (models/__init__.py:31-37): its config and the state dict of the stand-in's one parameter.
    torch.save(
        {
            "cfg": {"model": {"encoder": {"pretrained": False}}, "train_dataset": {"resolution": [384, 512]}},
            "weight": {"scale": torch.ones(1)},
        },
        tapip3d_ckpt,
    )
    wilor_ckpt = wilor / "pretrained_models" / "wilor_final.ckpt"
    wilor_ckpt.parent.mkdir(parents=True)
    # A Lightning checkpoint whose hyper-parameters hold a config object (WiLoR's is a yacs CfgNode): torch's
    # weights-only unpickler refuses it.
    torch.save({"state_dict": {}, "hyper_parameters": {"cfg": SimpleNamespace(MODEL={"IMAGE_SIZE": 256})}}, wilor_ckpt)
    sam3 = base / "sam3"
    sam3.mkdir()
    # SAM 3's layout (model_builder.py:777-784): a weights-only state dict, under "model"; the stand-in's one buffer.
    torch.save({"model": {"detector.brightness": torch.tensor(150.0)}}, sam3 / "sam3.pt")
    files = [
        wilor / "pretrained_models" / "model_config.yaml",
        wilor / "pretrained_models" / "detector.pt",
        wilor / "mano_data" / "MANO_RIGHT.pkl",
        wilor / "mano_data" / "mano_mean_params.npz",
        base / "cotracker" / "scaled_offline.pth",
        base / "gsam" / "sam2.1_hiera_large.pt",
        base / "gsam" / "grounding-dino-base" / "config.json",
    ]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"placeholder: the stand-ins check that the file exists")
    return {
        "vipe": vipe,
        "tapip3d": tapip3d,
        "wilor": wilor,
        "cotracker": base / "cotracker",
        "gsam": base / "gsam",
        "sam3": sam3,
    }


def real_gpu_settings(dirs: dict[str, Path]) -> str:
    """Settings YAML that runs depth, tracks and hands with the real-model adapters on ``dirs``."""
    return (
        "stages:\n"
        f"  depth: {{backend: vipe, params: {{weights_dir: '{dirs['vipe']}'}}}}\n"
        f"  tracks: {{backend: tapip3d, params: {{repo_dir: '{dirs['tapip3d']}'}}}}\n"
        f"  hands: {{backend: wilor, params: {{repo_dir: '{dirs['wilor']}', batch_size: 7}}}}\n"
    )


def real_gpu_yaml_on(models: Path, python: str) -> str:
    """configs/real-gpu.yaml with its environments and model folders moved onto the stand-ins (tracks2d on too)."""
    text = (ROOT / "configs" / "real-gpu.yaml").read_text()
    for model in ("vipe", "tapip3d", "cotracker", "wilor", "grounded_sam", "sam3"):
        text = text.replace(f"/opt/framefleet/envs/{model}/bin/python", python)
    text = text.replace("/opt/framefleet/models", str(models))
    return text.replace("enabled: false ", "enabled: true ")

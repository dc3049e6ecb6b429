"""A checkpoint, a model folder or a model config is a file of this host's weights folder: an absolute path or one
that leaves it is refused at load, naming the setting, before any loader (which may unpickle it) sees it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.backends import get_backend
from tasks.errors import ModelLoadError

# What the loader would unpickle: a file anyone with a shell on shared storage may have left.
PLANTED = "planted.pth"


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """A weights folder holding every default file, and a file outside it."""
    weights = tmp_path / "weights"
    (weights / "grounding-dino-base").mkdir(parents=True)
    for name in ("tapip3d_final.pth", "scaled_offline.pth", "sam3.pt", "sam2.1_hiera_large.pt"):
        (weights / name).write_bytes(b"")
    (tmp_path / PLANTED).write_bytes(b"")
    return weights, tmp_path / PLANTED


@pytest.mark.parametrize(
    "stage, backend, param",
    [
        ("tracks2d", "cotracker", "checkpoint"),
        ("masks", "sam3", "checkpoint"),
        ("masks", "grounded_sam", "sam2_checkpoint"),
        ("masks", "grounded_sam", "detector"),
    ],
)
@pytest.mark.parametrize("how", ["absolute", "dot-dot"])
def test_a_weights_file_outside_the_weights_folder_is_refused_naming_the_setting(folders, stage, backend, param, how):
    weights, planted = folders
    value = str(planted) if how == "absolute" else f"../{PLANTED}"
    model = get_backend(stage, backend, weights_dir=str(weights), **{param: value})
    with pytest.raises(ModelLoadError) as refused:
        model.load("cpu")
    message = str(refused.value)
    assert f"stages.{stage}.params.{param} = {value!r} must name a file inside the weights folder {weights}" in message
    assert "\n" not in message


def test_grounded_sams_config_is_one_of_the_sam2_packages(folders):
    weights, planted = folders
    model = get_backend("masks", "grounded_sam", weights_dir=str(weights), sam2_config=str(planted))
    with pytest.raises(ModelLoadError, match="stages.masks.params.sam2_config .* inside the sam2 package's configs"):
        model.load("cpu")


def test_tapip3ds_loader_never_sees_a_checkpoint_outside_the_weights_folder(folders, tmp_path):
    """TAPIP3D's load_model unpickles its file (torch.load(weights_only=False)): a checkout whose loader leaves a
    mark stands for it, and the mark must not appear."""
    weights, planted = folders
    repo = tmp_path / "TAPIP3D"
    (repo / "utils").mkdir(parents=True)
    mark = tmp_path / "loaded"
    (repo / "utils" / "inference_utils.py").write_text(
        f"def load_model(path):\n    open({str(mark)!r}, 'w').write(path)\n    raise SystemExit('loaded')\n"
        "def inference(**kwargs):\n    pass\n"
    )
    model = get_backend("tracks", "tapip3d", repo_dir=str(repo), weights_dir=str(weights), checkpoint=str(planted))
    with pytest.raises(ModelLoadError, match="stages.tracks.params.checkpoint"):
        model.load("cpu")
    assert not mark.exists()

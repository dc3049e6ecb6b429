"""Random weights for the real upstream models, in each upstream checkpoint format, at y2r's settings.

    python bench/gpu_models.py --step prepare --upstream DIR --models MODEL --weights DIR

DIR holds the upstream checkouts (``facebookresearch+co-tracker``, ``facebookresearch+sam2``,
``facebookresearch+sam3``, ``rolpotamias+WiLoR``) at deploy/envs/pins.sh's commits, as bench/gpu_lib.sh's
``upstream`` lays them out. MODEL (cotracker, grounded_sam, sam3 or wilor) is built by its own upstream code with
random weights (same shapes and compute as the trained model) and saved where its backend loads it from: the
first step of bench/real_chain.py's ``setup``. The models' memory and pace with these weights were measured by
this script's ``run`` step, at commit b08a959 (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import unittest.mock
from pathlib import Path

import numpy as np

PROMPT = "red t-shaped block"


def prepare(model: str, upstream: Path, weights: Path) -> None:
    """Write random weights of ``model`` into ``weights`` in the format its backend loads."""
    import torch

    torch.manual_seed(0)
    weights.mkdir(parents=True, exist_ok=True)
    if model == "cotracker":
        sys.path.insert(0, str(upstream / "facebookresearch+co-tracker"))
        from cotracker.models.build_cotracker import build_cotracker

        # hubconf.py:40-47: cotracker3_offline is build_cotracker(offline=True, window_len=60, v2=False).
        net = build_cotracker(checkpoint=None, offline=True, window_len=60, v2=False)
        torch.save(net.state_dict(), weights / "scaled_offline.pth")
    elif model == "grounded_sam":
        sys.path.insert(0, str(upstream / "facebookresearch+sam2"))
        from sam2.build_sam import build_sam2

        sam = build_sam2("configs/sam2.1/sam2.1_hiera_l.yaml", None, device="cpu")
        torch.save({"model": sam.state_dict()}, weights / "sam2.1_hiera_large.pt")
        grounding_dino_base(weights / "grounding-dino-base")
    elif model == "wilor":
        wilor_files(upstream / "rolpotamias+WiLoR", weights)
    elif model == "sam3":
        sam3_files(upstream / "facebookresearch+sam3", weights)
    else:
        raise SystemExit(f"unknown model {model!r}: choose cotracker, grounded_sam, sam3 or wilor")


SAM3_BPE = "bpe_simple_vocab_16e6.txt.gz"


def sam3_files(repo: Path, weights: Path) -> None:
    """SAM 3 from its own builder with random weights, saved as ``sam3.pt`` ({"model": state dict}, as
    model_builder.py:777-784 loads it) twice: ``found/``, whose scoring makes every query a detection
    (so the tracker follows objects), and ``none/``, whose scoring finds nothing. The tokenizer's
    vocabulary (package data, not in the source snapshot) is replaced by a few merges in its format:
    the text encoder's cost is set by its fixed context of 32 tokens, not by the vocabulary."""
    import gzip

    import torch

    sys.path.insert(0, str(repo))
    from sam3.model_builder import build_sam3_video_model

    bpe = weights / SAM3_BPE
    bpe.write_bytes(gzip.compress(b"#version: 0.2\nr e\nre d</w>\nb l\nbl o\nblo c\nbloc k</w>\n", mtime=0))
    model = build_sam3_video_model(checkpoint_path=None, load_from_HF=False, bpe_path=str(bpe), device="cpu")
    scoring = model.detector.dot_prod_scoring  # model_misc.py:68-93: (hs_proj . prompt_proj) / 16, clamped to 12
    presence = model.detector.transformer.decoder.presence_token_head.layers[-1]  # decoder.py:295-298
    for name, sign in (("found", 1.0), ("none", -1.0)):
        with torch.no_grad():
            for layer in (scoring.hs_proj, scoring.prompt_proj):
                layer.weight.zero_()
                layer.bias.fill_(1.0)
            scoring.prompt_proj.bias.mul_(sign)  # every query scores +12 (found) or -12 (none)
            presence.weight.zero_()
            presence.bias.fill_(10.0)  # the object is present: the joint score is the query's
        (weights / name).mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict()}, weights / name / "sam3.pt")


def wilor_files(repo: Path, weights: Path) -> None:
    """Random MANO files in MANO's shapes (the real ones are licensed) in ``repo``/mano_data, and a random
    WiLoR checkpoint in Lightning's format in ``weights``, built from the checkout's model_config.yaml."""
    import pickle
    import shutil

    import scipy.sparse
    import torch

    rng = np.random.default_rng(0)
    mano = repo / "mano_data"
    mano.mkdir(exist_ok=True)
    parents = np.array([2**32 - 1, 0, 1, 2, 0, 4, 5, 0, 7, 8, 0, 10, 11, 0, 13, 14], np.int64)
    weights_lbs = rng.random((778, 16))
    mano_right = {  # MANO_RIGHT.pkl's arrays (778 vertices, 1538 faces, 16 joints, 10 betas)
        "v_template": rng.normal(0, 0.05, (778, 3)),
        "shapedirs": rng.normal(0, 1e-3, (778, 3, 10)),
        "posedirs": rng.normal(0, 1e-3, (778, 3, 135)),
        "J_regressor": scipy.sparse.csc_matrix(rng.random((16, 778)) / 778),
        "kintree_table": np.stack([parents, np.arange(16)]),
        "weights": weights_lbs / weights_lbs.sum(1, keepdims=True),
        "f": rng.integers(0, 778, (1538, 3)).astype(np.uint32),
        "hands_components": rng.normal(0, 1, (45, 45)),
        "hands_mean": np.zeros(45),
    }
    with open(mano / "MANO_RIGHT.pkl", "wb") as f:
        pickle.dump(mano_right, f)
    identity6d = np.tile(np.array([1, 0, 0, 1, 0, 0], np.float32), 16)  # 16 rotations in 6D
    np.savez(mano / "mano_mean_params.npz", pose=identity6d, shape=np.zeros(10, np.float32), cam=np.array([0.9, 0, 0]))
    sys.path.insert(0, str(repo))
    os.chdir(repo)  # WiLoR reads ./mano_data (wilor/models/__init__.py:28-33)
    # pyrender: WiLoR's renderers (built at load) use it; nothing renders here, and it needs EGL.
    sys.modules.setdefault("pyrender", unittest.mock.MagicMock())
    import pytorch_lightning as pl
    from wilor.configs import get_config
    from wilor.models import WiLoR

    weights.mkdir(parents=True, exist_ok=True)
    shutil.copy(repo / "pretrained_models" / "model_config.yaml", weights / "model_config.yaml")
    cfg = get_config(str(weights / "model_config.yaml"), update_cachedir=True)
    cfg.defrost()
    cfg.MODEL.BACKBONE.pop("PRETRAINED_WEIGHTS", None)
    cfg.MANO.DATA_DIR = cfg.MANO.MODEL_PATH = "./mano_data/"
    cfg.MANO.MEAN_PARAMS = "./mano_data/mano_mean_params.npz"
    cfg.freeze()
    net = WiLoR(cfg, init_renderer=False)
    torch.save(
        {"state_dict": net.state_dict(), "pytorch-lightning_version": pl.__version__},
        weights / "wilor_final.ckpt",
    )


def grounding_dino_base(folder: Path) -> None:
    """Save a random GroundingDINO with IDEA-Research/grounding-dino-base's architecture, and a processor."""
    import transformers as tf

    # IDEA-Research/grounding-dino-base config.json: Swin-B (384, window 12), 6+6 layers, 900 queries.
    swin = tf.SwinConfig(
        embed_dim=128,
        depths=[2, 2, 18, 2],
        num_heads=[4, 8, 16, 32],
        window_size=12,
        image_size=384,
        out_features=["stage2", "stage3", "stage4"],
        out_indices=[2, 3, 4],
    )
    config = tf.GroundingDinoConfig(backbone_config=swin, text_config=tf.BertConfig())
    tf.GroundingDinoForObjectDetection(config).save_pretrained(folder)
    # bert-base-uncased's vocabulary cannot be fetched here; the prompt's words are enough: the text
    # encoder's cost depends on the token count, not on the vocabulary.
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "-", *PROMPT.split(), "t", "shaped"]
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(dict.fromkeys(words)) + "\n")
    tokenizer = tf.BertTokenizerFast(vocab_file=str(vocab))
    tf.GroundingDinoProcessor(image_processor=tf.GroundingDinoImageProcessor(), tokenizer=tokenizer).save_pretrained(
        folder
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step", choices=["prepare"], default="prepare")
    parser.add_argument("--upstream", type=Path, required=True)
    parser.add_argument("--models", required=True, help="cotracker, grounded_sam, sam3 or wilor")
    parser.add_argument("--weights", type=Path, default=Path("/tmp/ff-random-weights"))
    parser.add_argument("--clip", help=argparse.SUPPRESS)  # bench/real_chain.py passes these; prepare reads neither
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    prepare(args.models, args.upstream, args.weights / args.models)


if __name__ == "__main__":
    main()

"""Random TAPIP3D weights through its own upstream code, in the checkpoint format ``from_pretrained`` reads.

    python bench/gpu_conformance.py --upstream DIR/zbw001+TAPIP3D --weights DIR

The checkout (at deploy/envs/pins.sh's commit, with pointops2 installed) builds the model from
``tapip3d_config`` by its own ``models.from_config``; bench/real_chain.py's ``setup`` calls
``prepare_tapip3d`` for the tracks stage. The conformance run (TAPIP3D and WiLoR's stage classes on a
real clip, the output against the contract, their memory and pace) was this script's, at commit b08a959
(docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def tapip3d_config() -> Any:
    """TAPIP3D's checkpoint ``cfg``, reconstructed from its code (the released checkpoint's is not published).

    What the code fixes: ``models/__init__.py`` reads ``cfg.model`` (``name`` point_tracker_3d[_local]) and
    ``cfg.train_dataset.resolution``; the encoder is ``cotracker_cnn`` whose weights must load into
    CoTracker3's ``fnet`` (``models/encoders/cotracker_cnn.py:23-27``: ``BasicEncoder(output_dim=128,
    stride=4)``); the corr processor ``knn_corr_4d_optimized`` asserts ``better_depth_downsample``
    (knn_feature_4d_optimized.py:182); the updater's ``input_dim`` must equal 1 (visibility) + levels x
    transformer_dim + 6 x 33 (the posenc of the forward/backward motion, point_tracker_3d.py:187-221);
    its output's first 4 channels are dx, dy, dz, visibility (point_tracker_3d.py:233-234). A reading
    of the released checkpoint (published alongside TAPIP3D-based code) gives: seq_len 16, 4 levels,
    isotropic normalisation, 32 neighbours, an EfficientUpdateFormer of 3 time and 3 space blocks with
    64 virtual tracks. Assumed (CoTracker3's values where it has one): updater hidden 384, 8 heads,
    MLP ratio 4, a separate visibility/confidence head (output 5); neighbour transformer 128-d, 8 heads of
    16, MLP ratio 4; posenc MLP 2 layers of 256; no local-position or uv inputs; training resolution
    384x512 (it has no effect: ``inference`` sets the size to the video's).
    ``encoder.pretrained`` is false: true makes the load call ``torch.hub.load`` (cotracker_cnn.py:24-25).
    """
    from omegaconf import OmegaConf

    levels, dim = 4, 128
    return OmegaConf.create(
        {
            "model": {
                "name": "point_tracker_3d_local",
                "seq_len": 16,
                "corr_levels": levels,
                "norm_mode": "isotropic",
                "norm_scale": 1.0,
                "use_local_pos_input": False,
                "use_uv_input": False,
                "eval_mode": "raw",
                "encoder": {"name": "cotracker_cnn", "output_dim": 128, "stride": 4, "pretrained": False,
                            "freeze_mode": "none"},
                "corr_feature": {"name": "knn_corr_4d_optimized", "k_neighbors": 32, "posenc_mlp_dim": 256,
                                 "posenc_mlp_layers": 2, "transformer_dim": dim, "transformer_num_heads": 8,
                                 "transformer_head_dim": 16, "transformer_mlp_ratio": 4.0,
                                 "better_depth_downsample": True},
                "point_updater": {"name": "efficient_updateformer", "space_depth": 3, "time_depth": 3,
                                  "input_dim": 1 + levels * dim + 6 * 33, "hidden_size": 384, "num_heads": 8,
                                  "output_dim": 5, "mlp_ratio": 4.0, "num_virtual_tracks": 64,
                                  "add_space_attn": True, "linear_layer_for_vis_conf": True},
            },
            "train_dataset": {"resolution": [384, 512]},
        }
    )  # fmt: skip


def prepare_tapip3d(repo: Path, weights: Path) -> dict[str, Any]:
    """Build TAPIP3D from ``tapip3d_config`` by its own ``models.from_config``; save what ``from_pretrained`` reads."""
    import torch

    torch.manual_seed(0)
    sys.path.insert(0, str(repo))
    os.chdir(repo)
    import models  # TAPIP3D's (imports pointops2's CUDA extension)

    cfg = tapip3d_config()
    net = models.from_config(cfg["model"], image_size=cfg["train_dataset"]["resolution"])
    weights.mkdir(parents=True, exist_ok=True)
    path = weights / "tapip3d_final.pth"  # the README's name, the backend's default ``checkpoint``
    torch.save({"cfg": cfg, "weight": net.state_dict()}, path)
    return {
        "checkpoint": str(path),
        "parameters": sum(p.numel() for p in net.parameters()),
        "bytes": path.stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, required=True, help="the zbw001+TAPIP3D checkout")
    parser.add_argument("--weights", type=Path, required=True)
    args = parser.parse_args()
    print(json.dumps(prepare_tapip3d(args.upstream, args.weights)))


if __name__ == "__main__":
    main()

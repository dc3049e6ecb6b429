"""Stand-in for hgupt3/vipe ``vipe/model_cache.py``: ``create`` loads what the pipeline config names, on CUDA only.

Real ViPE is CUDA-only: the cache moves GeoCalib with ``.cuda()`` (model_cache.py:89-92), the
pipeline builds SLAM on ``torch.device("cuda")`` (pipeline/default.py:155) and frames are moved
with ``.cuda()`` (streams/base.py:148-159), so on a machine without CUDA ``create`` fails as
torch does ("Torch not compiled with CUDA enabled"). The stand-ins' venv sets
FRAMEFLEET_STANDIN_VIPE_CPU=1 so that the chain tests can run it on this CPU machine.

Like upstream it reads DroidNet from torch hub's folder (slam/networks/droid_net.py:534) and
GeoCalib through ``torch.hub.load_state_dict_from_url`` into ``<hub>/geocalib/pinhole.tar``
(priors/geocalib/extractor.py:34-40) unless the field of view is fixed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class VipeModelCache:
    device: Any = None

    @classmethod
    def create(
        cls,
        slam_cfg: Any = None,
        init_cfg: Any = None,
        post_cfg: Any = None,
        device: Any = "cuda",
        use_fp16: bool = False,
    ) -> VipeModelCache:
        if torch.device(device).type != "cuda" and os.environ.get("FRAMEFLEET_STANDIN_VIPE_CPU") != "1":
            raise AssertionError("Torch not compiled with CUDA enabled")
        ckpt = Path(torch.hub.get_dir()) / "droid_slam" / "droid.pth"
        if not ckpt.is_file():
            raise FileNotFoundError(f"{ckpt} is missing and the network is off")
        if init_cfg is not None and init_cfg.get("fixed_fov_degrees") is None:
            torch.hub.load_state_dict_from_url(
                "https://github.com/cvg/GeoCalib/releases/download/v1.0/geocalib-pinhole.tar",
                f"{torch.hub.get_dir()}/geocalib",
                map_location="cpu",
                file_name="pinhole.tar",
            )
        return cls(device=device)

"""Stand-in for hgupt3/vipe ``vipe/model_cache.py``: ``create`` reads DroidNet from torch hub's folder."""

from __future__ import annotations

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
        # vipe/slam/networks/droid_net.py: the checkpoint lives under torch.hub.get_dir().
        ckpt = Path(torch.hub.get_dir()) / "droid_slam" / "droid.pth"
        if not ckpt.is_file():
            raise FileNotFoundError(f"{ckpt} is missing and the network is off")
        return cls(device=device)

"""Stand-in for WiLoR's ``wilor/utils``: ``recursive_to``."""

from __future__ import annotations

import torch


def recursive_to(x, target):
    if isinstance(x, dict):
        return {k: recursive_to(v, target) for k, v in x.items()}
    if isinstance(x, torch.Tensor):
        return x.to(target)
    if isinstance(x, list):
        return [recursive_to(i, target) for i in x]
    return x

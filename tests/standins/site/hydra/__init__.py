"""Stand-in for hydra-core: ``initialize_config_dir`` and ``compose`` of ViPE's pipeline config from overrides."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any


class Node(dict):
    """A config node read by attribute, as OmegaConf's DictConfig is."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as exc:
            raise AttributeError(key) from exc


_CONFIG_DIR: list[Path] = []


@contextlib.contextmanager
def initialize_config_dir(config_dir: str, version_base: Any = None):
    folder = Path(config_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"config dir {folder} does not exist")
    _CONFIG_DIR.append(folder)
    try:
        yield
    finally:
        _CONFIG_DIR.pop()


def _value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


def compose(config_name: str, overrides: list[str] | None = None) -> Node:
    if not _CONFIG_DIR:
        raise RuntimeError("compose() outside initialize_config_dir()")
    pipeline = Node(name="default", init=Node(), slam=Node(), post=Node(), output=Node())
    cfg = Node(pipeline=pipeline)
    for item in overrides or []:
        key, _, value = item.lstrip("+").partition("=")
        if key == "pipeline":
            pipeline["name"] = value
            continue
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, Node())
        node[leaf] = _value(value)
    return cfg

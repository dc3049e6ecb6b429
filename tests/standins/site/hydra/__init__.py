"""Stand-in for hydra-core: ``initialize_config_dir`` and ``compose`` of ViPE's pipeline config from overrides.

As hydra does (hydra-core 1.3, ``_internal/config_loader_impl.py``): ``pipeline=NAME`` must name
a config in ``pipeline/`` (else "Could not find 'pipeline/NAME'"); ``key=value`` overrides a key
that exists and fails on one that does not ("Could not override ... Key ... is not in struct");
``+key=value`` adds a key that does not exist yet; ``++key=value`` adds or overrides.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import yaml


class Node(dict):
    """A config node read by attribute, as OmegaConf's DictConfig is."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as exc:
            raise AttributeError(key) from exc


class ConfigCompositionException(Exception):
    pass


class MissingConfigException(Exception):
    pass


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
    return yaml.safe_load(text)


def _nodes(data: Any) -> Any:
    if isinstance(data, dict):
        return Node({k: _nodes(v) for k, v in data.items()})
    return data


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _pipeline(folder: Path, name: str) -> dict:
    path = folder / "pipeline" / f"{name}.yaml"
    if not path.is_file():
        raise MissingConfigException(f"In 'default': Could not find 'pipeline/{name}'")
    data = yaml.safe_load(path.read_text()) or {}
    merged: dict = {}
    for parent in data.pop("defaults", []):
        merged = _merge(merged, _pipeline(folder, parent))
    return _merge(merged, data)


def compose(config_name: str, overrides: list[str] | None = None) -> Node:
    if not _CONFIG_DIR:
        raise RuntimeError("compose() outside initialize_config_dir()")
    folder = _CONFIG_DIR[-1]
    items = list(overrides or [])
    names = [item.partition("=")[2] for item in items if item.startswith("pipeline=")]
    if not names:
        raise MissingConfigException("You must specify 'pipeline', e.g, pipeline=<OPTION>")
    cfg = _nodes({"pipeline": _pipeline(folder, names[-1])})
    for item in items:
        if item.startswith("pipeline="):
            continue
        key, _, value = item.partition("=")
        add = key.startswith("+") and not key.startswith("++")
        either = key.startswith("++")
        *parents, leaf = key.lstrip("+").split(".")
        node = cfg
        for part in parents:
            if part not in node:
                if not (add or either):
                    raise ConfigCompositionException(
                        f"Could not override '{key}'. To append to your config use +{key}\n"
                        f"Key '{part}' is not in struct"
                    )
                node[part] = Node()
            node = node[part]
        if add and leaf in node:
            raise ConfigCompositionException(f"Could not append to config. An item is already at '{key.lstrip('+')}'.")
        if not (add or either) and leaf not in node:
            raise ConfigCompositionException(
                f"Could not override '{key}'. To append to your config use +{key}\nKey '{leaf}' is not in struct"
            )
        node[leaf] = _value(value)
    return cfg

"""The stage list is the one place stages are declared: tasks, settings, backends, inputs and chains agree with it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tasks import backends
from tasks.backends import base
from tasks.celery_app import TASK_PREFIX, app
from tasks.errors import UnknownBackend
from tasks.pipeline import STAGE_TASKS
from tasks.stages import ALL, CPU_STAGES, GPU_STAGES, STAGE_NAMES, ModelStage, chain_order, stage_class
from worker_config.settings import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[1]
KIND = {
    "depth": base.DepthBackend,
    "tracks": base.TrackBackend,
    "tracks2d": base.Track2DBackend,
    "hands": base.HandsBackend,
    "masks": base.MasksBackend,
}
# Names from docs/contracts.md that are spelled like a stage but name an HDF5 dataset or a statistic.
CONTRACT_NAMES = {
    ("tasks/statistics/stats.py", "depth"),
    ("tasks/cli/verify.py", "depth"),
    ("tasks/cli/verify.py", "tracks"),
    ("tasks/cli/y2r_strict.py", "tracks"),
    ("tasks/outputs/preview.py", "tracks"),
    ("tasks/cli/view.py", "tracks"),
    ("tasks/cli/view.py", "depth"),
}


def test_every_stage_has_one_task_one_settings_entry_and_a_default_backend_that_exists():
    assert len(set(STAGE_NAMES)) == len(ALL)
    assert set(STAGE_TASKS) == set(STAGE_NAMES)
    assert {n for n in app.tasks if n.startswith(TASK_PREFIX)} >= {TASK_PREFIX + s for s in STAGE_NAMES}
    conf = load_settings(None)
    assert list(conf.stages) == list(STAGE_NAMES)
    assert set(GPU_STAGES) | set(CPU_STAGES) == set(STAGE_NAMES) and not set(GPU_STAGES) & set(CPU_STAGES)
    assert conf.default_backends == "synthetic"  # the tests name it (conftest)
    for cls in ALL:
        stage = conf.stages[cls.name]
        assert stage.enabled is not cls.optional
        assert issubclass(cls, ModelStage) == (cls.device == "gpu")
        if cls.device == "gpu":
            assert cls.cpu_backend in backends.available(cls.name)
            assert stage.backend == (cls.default_backend or "synthetic")
        else:
            assert stage.backend == cls.default_backend


def test_without_a_named_backend_a_stage_runs_a_real_one_and_synthetic_only_when_asked(tmp_path, monkeypatch):
    from tasks.backends import defaults

    monkeypatch.setenv("FRAMEFLEET_DEFAULT_BACKENDS", "cpu")
    cpu = load_settings(None)
    assert {s: cpu.stages[s].backend for s in ("depth", "tracks", "hands", "tracks2d", "masks")} == {
        "depth": "classical",
        "tracks": "opencv",
        "hands": "mediapipe",
        "tracks2d": "opencv",
        "masks": "none",
    }
    # auto: y2r's model where configs/real-gpu.yaml's interpreter exists on this host (here: depth's only).
    python = tmp_path / "envs" / "vipe" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    layout = tmp_path / "real-gpu.yaml"
    layout.write_text(
        f"stages:\n  depth: {{backend: vipe, python: {python}, params: {{weights_dir: /nowhere}}}}\n"
        "  tracks: {backend: tapip3d, python: /no/such/python}\n"
    )
    monkeypatch.setattr(defaults, "UPSTREAM_CONFIG", layout)
    monkeypatch.setenv("FRAMEFLEET_DEFAULT_BACKENDS", "auto")
    auto = load_settings(None)
    assert (auto.stages["depth"].backend, auto.stages["depth"].python) == ("vipe", str(python))
    assert auto.stages["depth"].params == {"weights_dir": "/nowhere"}
    assert (auto.stages["tracks"].backend, auto.stages["hands"].backend) == ("opencv", "mediapipe")
    # a backend the settings name wins over every default
    config = tmp_path / "named.yaml"
    config.write_text("stages:\n  depth: {backend: synthetic}\n")
    assert load_settings(config).stages["depth"].backend == "synthetic"


def test_every_registered_backend_implements_its_stage_kind():
    for (stage, name), _target in backends.registry().items():
        assert stage in GPU_STAGES, f"backend {name!r} registered for {stage!r}, which is not a GPU stage"
        cls = backends.backend_class(stage, name)
        assert issubclass(cls, KIND[stage]) and cls.stage == stage and cls.name == name, (stage, name)


def test_the_default_chain_is_the_required_stages_and_optional_ones_slot_in_by_what_they_read(tmp_path):
    assert load_settings(None).enabled_stages() == tuple(c.name for c in ALL if not c.optional)
    config = tmp_path / "s.yaml"
    config.write_text("stages:\n  masks: {enabled: true}\n  tracks2d: {enabled: true}\n")
    order = load_settings(config).enabled_stages()
    for cls in ALL:
        for earlier in (*cls.reads, *(u for u in cls.uses if u in order)):
            if cls.name in order:
                assert order.index(earlier) < order.index(cls.name)
    assert {"masks", "tracks2d"} <= set(order)


def test_tracks_take_masks_only_when_the_masks_stage_runs():
    tracks = stage_class("tracks")
    outputs = {"preprocess": {"frames": 1}, "depth": {"depths": 2}, "masks": {"masks": 3}}
    assert tracks.select_inputs(outputs, {})["masks"] == 3
    assert "masks" not in tracks.select_inputs({k: v for k, v in outputs.items() if k != "masks"}, {})


def test_a_chain_missing_a_stage_that_another_reads_is_refused_naming_the_fix(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text("stages:\n  depth: {enabled: false}\n")
    with pytest.raises(ConfigError, match=r"reads depth, which is switched off; set stages.depth.enabled: true"):
        load_settings(config)
    with pytest.raises(ValueError, match="switched off"):
        chain_order({"depth": False})


def test_an_unknown_backend_is_refused_when_settings_load_naming_the_choices(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text("stages:\n  hands: {backend: nosuch}\n")
    with pytest.raises(ConfigError, match=r"unknown backend 'nosuch'.*available: .*synthetic"):
        load_settings(config)
    with pytest.raises(UnknownBackend, match="available: cotracker, opencv, synthetic"):
        backends.get_backend("tracks2d", "nosuch")


def test_no_module_names_a_stage_by_a_string_literal_outside_its_own_class():
    found = []
    for folder in ("tasks", "worker_config", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(("tasks/stages/", "tasks/backends/")):
                continue  # the stage classes, and backends declaring the stage kind they serve
            for node in ast.walk(ast.parse(path.read_text())):
                named = isinstance(node, ast.Constant) and node.value in STAGE_NAMES
                if named and (rel, node.value) not in CONTRACT_NAMES:
                    found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, "derive stage names from tasks.stages instead of spelling them:\n" + "\n".join(found)


def test_redis_key_names_are_spelled_only_in_tasks_keys():
    spelled = []
    for folder in ("tasks", "worker_config", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "tasks/keys.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("ff:"):
                    spelled.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not spelled, "name Redis keys in tasks/keys.py:\n" + "\n".join(spelled)

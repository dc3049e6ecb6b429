"""A GPU's worker families: gpuN for the main environment's stages, gpuN.<stage> for a stage with its own python."""

from __future__ import annotations

import sys

from tasks.autoscaler.families import Family, families, family_argv
from tests.conftest import settings_env
from worker_config.settings import load_settings


def test_without_an_own_python_one_family_hosts_every_gpu_stage():
    conf = load_settings()
    assert families(conf, 1) == [Family(1, "gpu1", ("depth", "tracks", "hands"))]
    argv = family_argv(conf, 1, "gpu1-3")
    assert argv[0] == sys.executable and argv[argv.index("-Q") + 1] == "gpu1" and "gpu1-3@%h" in argv


def test_a_stage_with_its_own_python_is_a_family_started_from_it(tmp_path):
    python = "/opt/envs/hands/bin/python"
    env = settings_env(tmp_path, f"stages:\n  hands: {{python: {python}}}\n")
    conf = load_settings(env["FRAMEFLEET_CONFIG"])
    assert families(conf, 0) == [Family(0, "gpu0", ("depth", "tracks")), Family(0, "gpu0.hands", ("hands",), python)]
    hands = family_argv(conf, 0, "gpu0.hands-2")
    assert hands[0] == python and hands[hands.index("-Q") + 1] == "gpu0.hands" and "gpu0.hands-2@%h" in hands
    assert family_argv(conf, 0, "gpu0-1")[0] == sys.executable

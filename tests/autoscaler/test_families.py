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


def test_a_runs_settings_become_a_family_whose_settings_file_gives_its_hashes(tmp_path, monkeypatch):
    from tasks.autoscaler.run_settings import CannotMatch, family_for
    from worker_config.settings import run_stage_settings, stage_entry

    own = settings_env(tmp_path, "stages:\n  depth: {params: {hold_mib: 200}}\n")["FRAMEFLEET_CONFIG"]
    monkeypatch.setenv("FRAMEFLEET_CONFIG", own)
    other = tmp_path / "other.yaml"
    other.write_text(
        "stages:\n  depth: {params: {flat_std_threshold: 0.05, hold_mib: 1}}\n  tracks2d: {enabled: true}\n"
    )
    run = run_stage_settings(load_settings(other))["stages"]
    family = family_for(load_settings(own), 0, "gpu0", run, tmp_path / "settings")
    assert family is not None and family.queue == "gpu0" and family.key == f"gpu0~{family.tag}"
    assert set(family.stages) == {"depth", "tracks", "tracks2d", "hands"}  # the run's GPU stages, tracks2d too
    theirs = load_settings(family.config)
    assert all(stage_entry(theirs, s)["sha256"] == run[s]["sha256"] for s in family.stages)
    assert theirs.stages["depth"].params["hold_mib"] == 200  # the host's own local knob, not the run's
    assert f"gpu0~depth-{run['depth']['sha256'][:12]}" in family.settings_queues
    # A stage setting of the autoscaler's environment would override the file: refused, not started wrong.
    monkeypatch.setenv("FRAMEFLEET_STAGES__DEPTH__PARAMS", '{"flat_std_threshold": 0.2}')
    try:
        family_for(load_settings(own), 0, "gpu0", run, tmp_path / "settings")
    except CannotMatch as exc:
        assert "depth" in str(exc)
    else:
        raise AssertionError("a family whose file gives other settings was made")


def test_a_runs_record_never_gives_this_host_an_interpreter_code_or_weights_folder(tmp_path, monkeypatch):
    from tasks.autoscaler.run_settings import CannotMatch, family_for
    from worker_config.settings import run_stage_settings

    own = settings_env(tmp_path, "stages:\n  depth: {params: {hold_mib: 200}}\n")["FRAMEFLEET_CONFIG"]
    monkeypatch.setenv("FRAMEFLEET_CONFIG", own)
    other = tmp_path / "other.yaml"
    other.write_text("stages:\n  depth: {params: {flat_std_threshold: 0.05}}\n")
    run = run_stage_settings(load_settings(other))["stages"]
    # What a record forged by anyone who reaches Redis could name: code on shared storage, another interpreter.
    planted = str(tmp_path / "planted")
    for stage in run.values():
        stage["python"] = f"{planted}/bin/python"
        stage["local"] = {**stage["local"], "repo_dir": planted, "weights_dir": planted, "hold_mib": 1}
        stage["settings"]["params"] = {**stage["settings"]["params"], "repo_dir": planted}
    family = family_for(load_settings(own), 0, "gpu0", run, tmp_path / "settings")
    assert family is not None and family.python is None  # this host's interpreter: its own settings name none
    written = tmp_path / "settings" / f"{family.tag}.yaml"
    assert planted not in written.read_text()
    assert written.stat().st_mode & 0o077 == 0  # it may hold the settings file's redis_url, password included
    theirs = load_settings(family.config)
    assert theirs.stages["depth"].params["hold_mib"] == 200 and theirs.stages["depth"].python is None
    # A stage with its own environment here only when this host's settings say which interpreter.
    try:
        family_for(load_settings(own), 0, "gpu0.hands", run, tmp_path / "settings")
    except CannotMatch as exc:
        assert "stages.hands.python" in str(exc)
    else:
        raise AssertionError("a family for gpu0.hands was made without this host's stages.hands.python")


def test_a_runs_record_never_gives_this_host_a_checkpoint_or_tokenizer(tmp_path, monkeypatch):
    """Upstream loaders unpickle their checkpoints: a path in a record would choose what a worker here runs. The
    record's value counts for its hash only; the file written holds this host's, and they must agree."""
    from tasks.autoscaler.run_settings import CannotMatch, family_for
    from worker_config.settings import run_stage_settings, stage_entry

    mine = "stages:\n  tracks: {backend: tapip3d, params: {repo_dir: /opt/TAPIP3D, weights_dir: /opt/w}}\n"
    own = settings_env(tmp_path, mine)["FRAMEFLEET_CONFIG"]
    monkeypatch.setenv("FRAMEFLEET_CONFIG", own)
    planted = str(tmp_path / "planted.pth")
    run = run_stage_settings(load_settings(own))["stages"]
    # A record written by anyone who reaches Redis: the path among the hashed parameters, the hash left as it was.
    run["tracks"]["settings"]["params"]["checkpoint"] = planted
    family = family_for(load_settings(own), 0, "gpu0", run, tmp_path / "settings")
    assert family is not None
    assert planted not in (tmp_path / "settings" / f"{family.tag}.yaml").read_text()
    assert load_settings(family.config).stages["tracks"].params.get("checkpoint") in (None, "tapip3d_final.pth")
    # The same path with the hash it gives: the file this host writes gives another, so no family at all.
    forged = tmp_path / "forged.yaml"
    forged.write_text(f"stages:\n  tracks: {{backend: tapip3d, params: {{checkpoint: {planted}}}}}\n")
    run = run_stage_settings(load_settings(forged))["stages"]
    assert stage_entry(load_settings(forged), "tracks")["settings"]["params"]["checkpoint"] == planted
    try:
        family = family_for(load_settings(own), 0, "gpu0", run, tmp_path / "settings")
    except CannotMatch as exc:
        assert "tracks" in str(exc)
    else:
        raise AssertionError(f"a family was made for a record naming {planted}: {family}")
    assert all(planted not in f.read_text() for f in (tmp_path / "settings").glob("*.yaml") if f != forged)

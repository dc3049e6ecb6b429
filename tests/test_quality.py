"""Quality measures and gates, provenance records and the lineage check, without workers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tasks.errors import BadInput, LowQuality, error_class
from tasks.job import Failure
from tasks.pipeline.quality import caught, check_length, enforce, shortfalls
from tasks.records import lineage
from tasks.stages.tracks import track_quality
from worker_config.settings import QualityGates, load_settings, resolved_stage, resolved_stages


def test_track_quality_counts_points_still_tracked_at_a_windows_end_and_how_long_each_was_followed():
    tracks = np.zeros((2, 4, 5, 3), np.float32)
    tracks[0, 2:, :4] = np.nan  # 4 of window 0's 4 points lost from step 2: each followed for 2 frames
    tracks[1, 3:, 0] = np.nan  # window 1: 1 of 2 points lost at the last step (3 frames), 1 kept (4)
    measured = track_quality(np.isfinite(tracks).all(axis=-1), np.array([4, 2]))
    assert measured["visible_fraction_min"] == 0.0
    assert measured["visible_fraction"] == 0.25  # the median of 0 and 0.5
    assert measured["median_track_length"] == 2.0  # of 2, 2, 2, 2, 3, 4
    assert track_quality(np.ones((2, 4, 5), bool), np.array([0, 0])) == {"windows": 2, "windows_with_points": 0}


def test_each_gate_fails_only_past_its_threshold_and_says_the_value_and_the_setting():
    quality = {
        "depth": {"flat_frame_pct": 12.0, "camera": "fallback", "reprojection_error_px": 3.0},
        "tracks": {"visible_fraction": 0.05, "median_track_length": 2.0},
        "hands": {"any_frame_fraction": 0.0},
    }
    assert {(s.stage, s.measure) for s in shortfalls(quality, QualityGates())} == {
        ("depth", "flat_frame_pct")
    }  # tracks followed a little (0.05, 2 frames) pass the defaults; the flat depth does not
    strict = QualityGates(
        allow_camera_fallback=False,
        max_reprojection_error_px=2.0,
        min_track_visible_fraction=0.1,
        min_median_track_length=5,
        min_hand_frame_fraction=0.5,
    )
    assert len(shortfalls(quality, strict)) == 6
    with pytest.raises(LowQuality) as caught:
        enforce(quality, strict)
    assert "tracks median_track_length 2.0 (quality.min_median_track_length: 5.0)" in str(caught.value)
    assert error_class(caught.value) == "low_quality"
    assert caught.value.detail["quality"] == quality
    loose = QualityGates(max_flat_frame_pct=50.0)
    enforce(quality, loose)  # passes
    enforce({}, strict)  # nothing measured (an earlier version's output): nothing to gate


# What the default stages measured of a featureless still wall (30 frames, CPU backends) and of the
# real clip that tracks worst (dog.mp4; docs/operations-defaults.md has the others).
WALL = {"tracks": {"windows": 21, "windows_with_points": 21, "visible_fraction": 0.0, "median_track_length": 1.0}}
DOG = {"tracks": {"windows": 32, "windows_with_points": 32, "visible_fraction": 0.2109, "median_track_length": 2.0}}
NO_WINDOW = {"tracks": {"windows": 0, "windows_with_points": 0}}


def test_the_default_gates_keep_out_a_still_wall_and_a_video_without_a_window_but_not_the_real_clips():
    gates = QualityGates()
    assert {s.setting for s in shortfalls(WALL, gates)} == {"min_track_visible_fraction", "min_median_track_length"}
    assert [s.setting for s in shortfalls(NO_WINDOW, gates)] == ["min_track_windows"]
    assert shortfalls(DOG, gates) == []


def test_quality_y2r_is_y2rs_flat_depth_rule_alone_and_a_preset_takes_overrides(tmp_path: Path):
    (tmp_path / "s.yaml").write_text("quality: y2r\n")
    y2r = load_settings(tmp_path / "s.yaml").quality
    assert shortfalls(WALL, y2r) == shortfalls(NO_WINDOW, y2r) == []
    assert y2r.max_flat_frame_pct == 10.0
    assert [s.setting for s in shortfalls({"depth": {"flat_frame_pct": 11.0}}, y2r)] == ["max_flat_frame_pct"]
    mixed = QualityGates.model_validate({"preset": "y2r", "min_track_windows": 1})
    assert [s.setting for s in shortfalls(NO_WINDOW, mixed)] == ["min_track_windows"]
    with pytest.raises(ValueError, match="unknown quality preset 'y2R'; the presets are default, y2r"):
        QualityGates.model_validate("y2R")


def test_a_video_shorter_than_a_track_window_is_bad_input_naming_the_frames_and_the_setting(tmp_path: Path):
    (tmp_path / "s.yaml").write_text("stages: {tracks: {params: {window_length: 8}}}\n")
    conf = load_settings(tmp_path / "s.yaml")
    chain = conf.enabled_stages()
    check_length("a.mp4", 8, chain, conf)  # one window exactly
    with pytest.raises(BadInput) as short:
        check_length("a.mp4", 7, chain, conf)
    assert "a.mp4: too short for the chain: 7 frame(s)" in str(short.value)
    assert "(stages.tracks.params.window_length: 8)" in str(short.value)
    check_length("a.mp4", 1, ("preprocess", "depth", "hands", "h5"), conf)  # no tracks: one frame will do


def test_the_summary_counts_what_each_gate_kept_out():
    low = {"wall": shortfalls(WALL, QualityGates()), "blank": shortfalls(NO_WINDOW, QualityGates())}
    failed = [
        {"error_class": "BadInput", "reason": "one.mp4: too short for the chain: 1 frame(s) ..."},
        {"error_class": "BadInput", "reason": "x.mp4: not a readable video container"},
    ]
    assert caught({k: [vars(s) for s in v] for k, v in low.items()}, failed) == {
        "quality.min_median_track_length": 1,
        "quality.min_track_visible_fraction": 1,
        "quality.min_track_windows": 1,
        "too short (bad_input)": 1,
    }


def test_a_failure_record_keeps_its_detail_and_old_records_without_one_still_read():
    record = Failure("tracks", "low_quality", "below", 1, "w", 1.0, detail={"shortfalls": []})
    assert Failure.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    old = {"stage": "depth", "error_class": "BadInput", "reason": "x", "attempts": 1, "worker": "w", "time": 2.0}
    assert Failure.from_dict(old).detail is None and "detail" not in Failure.from_dict(old).to_dict()


def test_the_resolved_settings_fill_in_defaults_and_their_hash_follows_any_change(tmp_path: Path):
    conf = load_settings(None)
    settings, digest = resolved_stage(conf, "tracks")
    assert settings["params"]["window_length"] == 10 and settings["backend"] == "synthetic"
    assert resolved_stage(load_settings(None), "tracks") == (settings, digest)  # the same in another load
    other = tmp_path / "s.yaml"
    other.write_text("stages:\n  tracks: {params: {target_points: 32}}\n")
    assert resolved_stage(load_settings(other), "tracks")[1] != digest
    # Deadlines and retries do not change what a stage makes.
    other.write_text("stages:\n  tracks: {deadline_s: 99, max_retries: 0}\n")
    assert resolved_stage(load_settings(other), "tracks")[1] == digest


def test_continuing_a_dataset_with_another_backend_is_refused_naming_it_unless_mixed(tmp_path: Path):
    from tasks.run.dataset import write_manifest

    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    (raw / "a.mp4").write_bytes(b"x")
    made = load_settings(None)
    write_manifest(raw, out, [raw / "a.mp4"], "run-1", made_with=lineage.current_set(made, "run-1"))
    assert lineage.check_same(out, made, mixed=False) == []
    other = tmp_path / "s.yaml"
    other.write_text("stages:\n  depth: {backend: classical}\n  tracks: {params: {target_points: 32}}\n")
    changed = load_settings(other)
    with pytest.raises(lineage.SettingsChanged) as caught:
        lineage.check_same(out, changed, mixed=False)
    assert "depth.backend: synthetic -> classical" in str(caught.value)
    assert "depth.params" not in str(caught.value)  # another backend's parameters differ anyway: not listed
    assert "tracks.params.target_points: 64 -> 32" in str(caught.value)
    assert "--force" in str(caught.value) and "--mixed" in str(caught.value)
    assert lineage.check_same(out, changed, mixed=True) == []
    write_manifest(raw, out, [raw / "a.mp4"], "run-2", made_with=lineage.current_set(changed, "run-2"))
    sets = json.loads((out / "manifest.json").read_text())["provenance"]
    assert [s["sha256"] for s in sets] == [resolved_stages(made)["sha256"], resolved_stages(changed)["sha256"]]
    assert lineage.check_same(out, changed, mixed=False) == []  # now one of its sets


def test_a_model_stage_built_in_code_without_a_backend_gets_the_real_cpu_one_unless_synthetic_is_asked(
    monkeypatch: pytest.MonkeyPatch,
):
    from tasks.backends.defaults import describe
    from tasks.stages import DepthStage, HandsStage, TracksStage

    monkeypatch.delenv("FRAMEFLEET_DEFAULT_BACKENDS")
    assert [cls().backend_name for cls in (DepthStage, TracksStage, HandsStage)] == ["classical", "opencv", "mediapipe"]
    monkeypatch.setenv("FRAMEFLEET_DEFAULT_BACKENDS", "synthetic")
    assert DepthStage().backend_name == "synthetic"
    lines = describe({"depth": "classical", "hands": "synthetic", "h5": "builtin"})
    assert lines[0].startswith("WARNING: hands uses the SYNTHETIC backends")
    assert lines[1] == "depth: classical — " + lines[1].split(" — ", 1)[1] and "no ViPE" in lines[1]
    assert len(lines) == 3  # the stage without a model is not listed

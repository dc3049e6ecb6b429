"""A run's stage settings are its workers' settings: refused before it starts when no live worker has them,
served only by workers that do, and named by the stall report while its tasks wait for one."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import redis

from tasks.delivery import queues
from tasks.job import Job
from tests.conftest import ROOT, run_script, settings_env, wait_for_run_end, wait_until
from worker_config.settings import load_settings, run_stage_settings, stage_entry
from worker_config.settings_match import explain, unserved

REAL_CPU = str(ROOT / "configs" / "real-cpu.yaml")
CLASSICAL_DEPTH = "stages:\n  depth: {backend: classical}\n"


def worker_of(name: str, conf, stages: list[str], queues: list[str]) -> dict:
    """A registry state as a worker of ``conf`` publishes it."""
    return {
        "hostname": f"{name}@host",
        "stages": stages,
        "gpu_queues": queues,
        "settings": {s: stage_entry(conf, s) for s in stages},
    }


def test_the_difference_is_named_per_stage_with_the_command_that_starts_a_matching_worker():
    run = run_stage_settings(load_settings(REAL_CPU))
    defaults = load_settings()
    live = [
        worker_of("gpu0", defaults, ["depth", "tracks", "hands"], ["gpu0"]),
        worker_of("cpu", defaults, ["preprocess", "h5"], []),
    ]
    lines = explain(unserved(run["stages"], live), REAL_CPU, {}, "cpu", "abcd1234")
    assert lines[:3] == [
        "depth: classical (run) vs synthetic (workers gpu0@host)",
        "tracks: opencv (run) vs synthetic (workers gpu0@host)",
        "hands: mediapipe (run) vs synthetic (workers gpu0@host)",
    ]
    # real-cpu.yaml's CPU stages are the defaults (target_fps: 10 is 10.0): the cpu worker serves them.
    assert len(lines) == 4 and f"env FRAMEFLEET_CONFIG={REAL_CPU} celery -A tasks worker -Q gpu0 -P solo" in lines[3]
    # A worker with the run's settings anywhere serves the stage.
    live.append(worker_of("gpu1", load_settings(REAL_CPU), ["depth", "tracks", "hands"], ["gpu1"]))
    assert unserved(run["stages"], live) == []


def test_parameters_are_named_when_the_backends_agree_and_host_local_ones_do_not_count(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text("stages:\n  depth: {backend: classical, params: {min_flow_px: 2}}\n")
    run = run_stage_settings(load_settings(config))
    worker = worker_of("gpu0", load_settings(REAL_CPU), ["depth"], ["gpu0"])
    (line, _) = explain(unserved({"depth": run["stages"]["depth"]}, [worker]), None, {}, "cpu", "x")
    assert line == "depth: classical {min_flow_px: 2} (run) vs classical {min_flow_px: 1.0} (workers gpu0@host)"
    # The stand-ins' pacing is local to a worker (it changes no output): a slow worker serves a plain run.
    paced = tmp_path / "paced.yaml"
    paced.write_text("stages:\n  depth: {params: {seconds_per_frame: 0.5, hold_mib: 100}}\n")
    assert stage_entry(load_settings(paced), "depth")["sha256"] == stage_entry(load_settings(), "depth")["sha256"]
    assert stage_entry(load_settings(paced), "depth")["local"]["seconds_per_frame"] == 0.5


def test_a_task_goes_to_its_settings_queue_exactly_where_its_queues_workers_do_not_all_have_the_runs_settings():
    from worker_config.settings_match import parse_settings_queue, settings_route

    plain, classical = load_settings(), load_settings(REAL_CPU)
    sha = stage_entry(classical, "depth")["sha256"]
    same = {**worker_of("gpu0b", classical, ["depth"], ["gpu0"]), "queues": ["gpu0"]}
    other = {**worker_of("gpu0a", plain, ["depth"], ["gpu0"]), "queues": ["gpu0"]}
    beside = f"gpu0~depth-{sha[:12]}"
    assert settings_route("gpu0", "depth", sha, [same]) == "gpu0"  # every worker of gpu0 has them
    assert settings_route("gpu0", "depth", sha, [same, other]) == beside  # mixed: only gpu0b consumes it
    assert settings_route("gpu0", "depth", sha, [other]) == beside  # none: it waits there, not on gpu0a
    assert settings_route("gpu0", "depth", sha, []) == "gpu0"  # nobody hosts it: it waits as any task
    assert settings_route("gpu0", "depth", None, [other]) == "gpu0"  # a job of an earlier version
    assert parse_settings_queue(beside) == ("gpu0", "depth", sha[:12]) and parse_settings_queue("gpu0.hands") is None
    assert load_settings().gpu_index(beside) is None and load_settings().gpu_index("gpu0.hands") == 0


def test_a_job_carries_its_stages_settings_and_one_without_them_reads_as_before():
    wire = {"run_id": "r", "video_id": "v", "video": "v.mp4", "dataset_root": "/d", "output_root": "/o"}
    old = Job.from_dict(wire)
    assert old.settings == {} and "settings" not in old.to_dict()
    new = Job.from_dict({**wire, "settings": {"depth": "ab" * 32}})
    assert new.settings == {"depth": "ab" * 32}
    assert json.loads(json.dumps(new.to_dict()))["settings"] == {"depth": "ab" * 32}


def enqueue(raw: Path, out: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return run_script("enqueue_dataset.py", str(raw), "--out", str(out), *args, env=env, timeout_s=280)


def test_a_run_no_live_worker_can_serve_is_refused_before_anything_is_sent_then_a_matching_worker_serves_it(
    video_factory, workers, pipeline_env, tmp_path
):
    raw = video_factory(1)
    workers.start("cpu")  # as the README's by-hand path starts them: no FRAMEFLEET_CONFIG
    workers.start("gpu0")
    out = tmp_path / "out"
    refused = enqueue(raw, out, pipeline_env, "--config", REAL_CPU)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "depth: classical (run) vs synthetic (workers gpu0@test)" in refused.stderr
    assert "hands: mediapipe (run) vs synthetic (workers gpu0@test)" in refused.stderr
    # The tests' processes have FRAMEFLEET_DEFAULT_BACKENDS=synthetic (tests/conftest.py): it decides settings too.
    assert f"FRAMEFLEET_CONFIG={REAL_CPU} FRAMEFLEET_DEFAULT_BACKENDS=synthetic celery -A tasks worker -Q gpu0" in (
        refused.stderr
    )
    assert "--wait-for-workers" in refused.stderr
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    assert not list(r.scan_iter("ff:runinfo:*")) and not r.exists("gpu0", "cpu")  # nothing was sent
    assert not (out / "manifest.json").exists()

    # As the message says: a second worker of gpu0, with the run's settings, beside the one without.
    workers.start("gpu0", name="gpu0real", env={"FRAMEFLEET_CONFIG": REAL_CPU})
    done = enqueue(raw, out, pipeline_env, "--config", REAL_CPU)
    assert done.returncode == 0, done.stdout + done.stderr
    (vid,) = json.loads((out / "run_summary.json").read_text())["done_videos"]
    notes = json.loads((out / "run_summary.json").read_text())["notes"][vid]
    assert notes["depth"]["depth_backend"] == "classical" and notes["hands"]["hands_backend"] == "mediapipe"
    assert f"ran depth of {vid}" in workers.log("gpu0real") and "ran depth" not in workers.log("gpu0")
    assert "ran hands" not in workers.log("gpu0")
    (record,) = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    advertised = workers.state("gpu0real")["settings"]["depth"]["sha256"]
    assert record["stage_settings"]["stages"]["depth"]["sha256"] == advertised


def test_a_run_enqueued_for_workers_that_will_come_waits_says_why_and_runs_only_on_a_matching_one(
    video_factory, workers, pipeline_env, tmp_path
):
    fast = {"FRAMEFLEET_LEASE_TTL_S": "6"}  # a worker with other settings sends the task on every 3 s
    workers.start("cpu", env=fast)
    workers.start("gpu0", env=fast)
    env = settings_env(tmp_path, CLASSICAL_DEPTH)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "enqueue_dataset.py"), str(video_factory(1)), "--out", str(out)]
        + ["--wait-for-workers"],
        cwd=ROOT,
        env={**pipeline_env, **env},  # the default stall_after_s (60 s): a concrete cause is said sooner
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, seen = time.monotonic() + 150, ""
        while time.monotonic() < deadline and "waits for a worker with its settings" not in seen:
            seen += proc.stderr.readline()
        assert "no live worker runs this run's settings yet" in seen  # said when it was enqueued
        stall = seen.split("no task finished for ")[-1]
        assert int(stall.split(" s: ")[0]) <= 20, stall  # said within about 15 s of the last progress
        assert "waits for a worker with its settings: depth: classical (run) vs synthetic (workers gpu0@test)" in stall
        started = f"FRAMEFLEET_CONFIG={env['FRAMEFLEET_CONFIG']} FRAMEFLEET_DEFAULT_BACKENDS=synthetic celery -A tasks"
        assert started + " worker -Q gpu0" in stall
        # Routed past the worker without them, straight to the settings queue only a matching worker consumes.
        assert "(1 tasks wait in gpu0~depth-" in stall and "ran depth" not in workers.log("gpu0")
        status = run_script("status.py", "--out", str(out), env=pipeline_env)
        assert "  depth: classical (run) vs synthetic (workers gpu0@test)" in status.stdout, status.stderr

        workers.start("gpu1", env={**env, **fast})
        _, rest = proc.communicate(timeout=200)
        assert proc.returncode == 0, seen + rest
    finally:
        proc.kill()
        proc.wait()
    (vid,) = json.loads((out / "run_summary.json").read_text())["done_videos"]
    assert json.loads((out / "run_summary.json").read_text())["notes"][vid]["depth"]["depth_backend"] == "classical"
    assert f"ran depth of {vid}" in workers.log("gpu1") and "ran depth" not in workers.log("gpu0")


def test_two_runs_with_different_settings_at_once_each_run_under_their_own(
    video_factory, workers, pipeline_env, tmp_path
):
    classical = settings_env(tmp_path, CLASSICAL_DEPTH)
    workers.start("cpu")
    workers.start("gpu0")  # the defaults: synthetic depth
    workers.start("gpu1", env=classical)
    raw = video_factory(2)
    plain, other = tmp_path / "plain", tmp_path / "classical"
    assert enqueue(raw, plain, pipeline_env, "--no-wait").returncode == 0
    assert enqueue(raw, other, {**pipeline_env, **classical}, "--no-wait").returncode == 0
    for out in (plain, other):
        wait_for_run_end(out, 240)
    advertised = {name: workers.state(name)["settings"]["depth"]["sha256"] for name in ("gpu0", "gpu1")}
    assert advertised["gpu0"] != advertised["gpu1"]
    for out, worker, backend in ((plain, "gpu0", None), (other, "gpu1", "classical")):
        summary = json.loads((out / "run_summary.json").read_text())
        assert len(summary["done_videos"]) == 2
        (record,) = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
        assert record["stage_settings"]["stages"]["depth"]["sha256"] == advertised[worker]
        for vid in summary["done_videos"]:
            assert summary["notes"].get(vid, {}).get("depth", {}).get("depth_backend") == backend
            assert f"ran depth of {vid}" in workers.log(worker)
    # The same two videos in each run: each GPU worker made the depth of its own run's two.
    assert workers.log("gpu0").count("ran depth of") == 2 and workers.log("gpu1").count("ran depth of") == 2


def test_a_run_continuing_a_video_redoes_what_other_settings_made_and_keeps_what_its_own_made(
    video_factory, workers, pipeline_env, tmp_path
):
    from tasks.outputs.stage_io import marker_of

    classical = settings_env(tmp_path, CLASSICAL_DEPTH)
    workers.start("cpu")
    workers.start("gpu0")  # the defaults: synthetic depth
    raw, out = video_factory(1), tmp_path / "out"
    assert enqueue(raw, out, pipeline_env).returncode == 0
    (vid,) = json.loads((out / "run_summary.json").read_text())["done_videos"]
    (out / f"{vid}.hdf5").unlink()  # the video is unfinished again; its intermediates stay
    synthetic = json.loads(marker_of(out, vid, "depth").read_text())["settings"]

    workers.start("gpu1", env=classical)
    again = enqueue(raw, out, {**pipeline_env, **classical}, "--continue", "--mixed")
    assert again.returncode == 0, again.stdout + again.stderr
    notes = json.loads((out / "run_summary.json").read_text())["notes"][vid]
    assert notes["depth"]["depth_backend"] == "classical"  # made anew, not the synthetic depth found
    made = json.loads(marker_of(out, vid, "depth").read_text())["settings"]
    assert made == workers.state("gpu1")["settings"]["depth"]["sha256"] != synthetic
    assert f"redoing depth of {vid}" in workers.log("gpu1")
    assert workers.log("cpu").count(f"ran preprocess of {vid}") == 1  # the same settings: its output was kept


def test_cpu_tasks_other_workers_cannot_serve_go_straight_to_the_one_that_can(
    video_factory, workers, pipeline_env, tmp_path
):
    """Sent before any CPU worker was live, the run's tasks wait in the cpu queue; two workers without its
    preprocess settings hand each they take to its settings queue at once, where only the matching one takes it."""
    half = settings_env(tmp_path, "stages:\n  preprocess: {params: {target_fps: 5}}\n")
    workers.start("gpu0")
    # 2.4 s clips: 12 frames at 5 fps, one track window and more (shorter ones are bad_input before any model).
    raw, out = video_factory(3, 2.4), tmp_path / "out"
    assert enqueue(raw, out, {**pipeline_env, **half}, "--no-wait").returncode == 0
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    assert queues.length(r, "cpu") == 3
    workers.start("cpu", name="cpua", wait=False)
    workers.start("cpu", name="cpub", wait=False)
    wait_until(lambda: not queues.length(r, "cpu"), 120, "the cpu queue taken")  # by the two without the run's settings
    workers.start("cpu", name="cpuhalf", env=half)
    summary = wait_for_run_end(out, 240)
    assert len(summary["done_videos"]) == 3, summary
    others = workers.log("cpua") + workers.log("cpub")
    for vid in summary["done_videos"]:
        assert f"ran preprocess of {vid}" in workers.log("cpuhalf") and f"ran preprocess of {vid}" not in others
        # Handed on once, to the queue only a worker with the run's settings consumes: never to the other one.
        assert others.count(f"preprocess of {vid}: this worker runs") == 1, others[-3000:]
    assert "sent on to cpu~preprocess-" in others
    (record,) = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    advertised = workers.state("cpuhalf")["settings"]["preprocess"]["sha256"]
    assert record["stage_settings"]["stages"]["preprocess"]["sha256"] == advertised


def test_wilors_call_sizes_are_local_and_its_detection_settings_are_not(tmp_path):
    def hands_sha(params: str) -> str:
        config = tmp_path / "hands.yaml"
        config.write_text(f"stages:\n  hands: {{backend: wilor, params: {{{params}}}}}\n")
        return stage_entry(load_settings(config), "hands")["sha256"]

    plain = hands_sha("repo_dir: /opt/WiLoR")
    # How many frames a detector call and crops a WiLoR call take: the same hands, so any worker serves the run.
    assert hands_sha("repo_dir: /opt/WiLoR, detection_batch: 8, batch_size: 64") == plain
    assert hands_sha("repo_dir: /srv/WiLoR, detection_batch: 150") == plain
    assert hands_sha("repo_dir: /opt/WiLoR, detection_confidence: 0.5") != plain

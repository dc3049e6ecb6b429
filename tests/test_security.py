"""A message can't hurt the host: the forged jobs of issue 37 against a real worker, and `framefleet verify`
failing on an edited, a truncated and a missing file. (The property test over every shape: tests/faults.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.cli import verify
from tests.conftest import CONFINED_ENV, ROOT, run_script, send_task, task_result, wait_until


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (links not followed) but the workers' logs: relative path -> (size, mtime ns)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        if dirpath == str(folder) and "logs" in dirnames:
            dirnames.remove("logs")  # the tests' worker logs (tests.conftest.Workers)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            found[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return found


def refused(url: str, task_id: str) -> str:
    """The refusal a task ended with (its exception's message); fails the test if the task succeeded."""
    meta = wait_until(lambda: task_result(url, task_id), 60, f"task {task_id} to end")
    assert meta["status"] == "FAILURE", meta
    message = meta["result"]["exc_message"]
    return str(message[0] if isinstance(message, list) else message)


@pytest.fixture(scope="module")
def finished(video_factory, cluster, tmp_path_factory) -> Path:
    """A finished run's OUT (markers, manifest, statistics) of three short videos, made by the shared workers."""
    out = tmp_path_factory.mktemp("finished") / "out"
    done = run_script("enqueue_dataset.py", str(video_factory(3, 1.2)), "--out", str(out), env=cluster.env)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture
def made(finished, tmp_path) -> Path:
    """A copy of ``finished`` of this test's own, to damage."""
    return Path(shutil.copytree(finished, tmp_path / "out", symlinks=True))


def test_verify_fails_on_an_edited_a_truncated_and_a_missing_file(made, tmp_path, capsys):
    assert verify.main([str(made)]) == 0, capsys.readouterr().out
    files = sorted(made.glob("*.hdf5"))
    assert len(files) == 3
    edited, truncated, missing = files
    data = bytearray(edited.read_bytes())
    middle = len(data) // 2  # inside the pixel data, size and layout kept
    data[middle : middle + 64] = bytes(255 - b for b in data[middle : middle + 64])
    edited.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[: len(data) // 3])
    missing.unlink()
    capsys.readouterr()
    assert verify.main([str(made)]) == 1
    out = capsys.readouterr().out
    assert f"{edited.name}: sha256 " in out and "edited since it was written" in out, out
    assert f"{truncated.name}: " in out and "truncated or replaced" in out, out
    assert f"{missing.name}: missing, but the manifest records" in out, out
    # As a user runs it: a problem line and the problems' exit status, never a traceback.
    ran = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "verify", str(made)], cwd=ROOT, capture_output=True, text=True
    )
    assert ran.returncode == 1 and "Traceback" not in ran.stdout + ran.stderr, ran.stdout + ran.stderr
    assert "FAILED: " in ran.stdout


def test_a_file_no_run_wrote_is_named(made, capsys):
    shutil.copy(next(made.glob("*.hdf5")), made / "planted-0123456789.hdf5")
    assert verify.main([str(made)]) == 1
    assert "planted-0123456789.hdf5: no video of the manifest has this file" in capsys.readouterr().out


def test_the_forged_jobs_of_issue_37_write_nothing_and_a_valid_one_is_served(video_factory, workers, tmp_path):
    """The shapes that deleted a dataset, read /etc/passwd and wrote outside OUT, against a worker confined
    as `framefleet run` confines its own (its RAW and OUT)."""
    raw = tmp_path / "raw"
    shutil.copytree(video_factory(1), raw)
    out = tmp_path / "out"
    (out / "work").mkdir(parents=True)
    (out / "earlier.hdf5").write_bytes(b"an earlier video's dataset file")
    beside = tmp_path / "beside.txt"
    beside.write_text("a file beside OUT")
    workers.start("cpu", env={"FRAMEFLEET_DATASET_ROOT": str(raw), "FRAMEFLEET_OUTPUT_ROOT": str(out)})
    url = workers.env["REDIS_URL"]
    before = snapshot(tmp_path)
    video = next(p.name for p in raw.iterdir())
    valid = {"run_id": "20261127-101010-abcdef", "video_id": "clip-0123456789", "video": video}
    valid.update(dataset_root=str(raw), output_root=str(out), intermediates="drop", gpus=None, gpu=None)
    forged = [
        ("framefleet.h5", {"video_id": ".."}, "video_id"),
        ("framefleet.h5", {"video_id": "."}, "video_id"),
        ("framefleet.h5", {"video_id": "a/../../b"}, "video_id"),
        ("framefleet.preprocess", {"video_id": "v\nforged line"}, "video_id"),
        ("framefleet.preprocess", {"dataset_root": "/", "video": "etc/passwd"}, "dataset_root"),
        ("framefleet.preprocess", {"output_root": str(tmp_path)}, "output_root"),
        ("framefleet.preprocess", {"run_id": "../../x"}, "run_id"),
        ("framefleet.preprocess", {"output_root": str(out) + "/../out"}, "output_root"),
    ]
    ids = [send_task(url, name, ({**valid, **fields},), "cpu", ignore_result=False) for name, fields, _ in forged]
    for task_id, (_, fields, field) in zip(ids, forged, strict=True):
        reason = refused(url, task_id)
        assert reason.startswith("job refused: ") and field in reason, (fields, reason)
    assert snapshot(tmp_path) == before  # refused: nothing written, nothing deleted, anywhere
    log = workers.log("cpu")
    assert "forged line" not in log.replace("\\nforged line", "")  # the newline never split a log line
    served = send_task(url, "framefleet.preprocess", (valid,), "cpu", ignore_result=False)
    meta = wait_until(lambda: task_result(url, served), 120, "the valid job to be served")
    assert meta["status"] == "SUCCESS" and (out / "work" / "clip-0123456789" / "preprocess.npz").is_file(), meta


def test_a_hand_started_worker_without_roots_serves_only_roots_allowed_here(video_factory, workers, tmp_path):
    """Started as the README says (`celery -A tasks worker -Q cpu`), with no roots in its settings."""
    env = {k: v for k, v in workers.env.items() if k not in CONFINED_ENV}
    workers.env = env
    workers.launch("hand", ["-Q", "cpu", "-n", "hand@test"])
    wait_until(lambda: workers.state("hand"), 60, "the hand-started worker to register")
    # Said once: a second copy (logging's last resort, before Celery's logging is set up) is noise.
    assert workers.log("hand").count("this worker has no dataset_root/output_root") == 1, workers.log("hand")
    raw = tmp_path / "raw"
    shutil.copytree(video_factory(1), raw)
    out, other = tmp_path / "out", tmp_path / "other"
    job = {"run_id": "r1", "video_id": "v1", "video": next(p.name for p in raw.iterdir()), "dataset_root": str(raw)}
    url = env["REDIS_URL"]
    first = send_task(url, "framefleet.preprocess", ({**job, "output_root": str(out)},), "cpu", ignore_result=False)
    assert "not among the roots allowed on this host" in refused(url, first)
    assert not out.exists()
    # An operator on this host allows them (as `framefleet enqueue RAW --out OUT` does here): served.
    from tasks.workers import confinement
    from worker_config.settings import Settings

    confinement.allow(Settings(), raw, out)
    second = send_task(url, "framefleet.preprocess", ({**job, "output_root": str(out)},), "cpu", ignore_result=False)
    assert wait_until(lambda: task_result(url, second), 120, "the allowed job")["status"] == "SUCCESS"
    third = send_task(url, "framefleet.preprocess", ({**job, "output_root": str(other)},), "cpu", ignore_result=False)
    assert "not among the roots allowed" in refused(url, third) and not other.exists()


def test_a_refused_video_of_a_real_run_is_counted_failed_and_the_run_ends(video_factory, cluster, tmp_path):
    """A video whose path holds a control character is refused by the gate, writes nothing, and counts as
    failed in its run (Redis only), so the run ends with it named while the other videos are done."""
    raw = tmp_path / "raw"
    shutil.copytree(video_factory(2), raw)
    shutil.copy(next(raw.iterdir()), raw / "two\nlines.mp4")
    out = tmp_path / "out"
    done = run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=cluster.env)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["done"] == 2 and [f["video"] for f in summary["failed"]] == ["two\nlines.mp4"], summary
    failure = summary["failed"][0]
    assert failure["error_class"] == "JobRefused" and "job refused: video " in failure["reason"], failure
    assert not (out / "work" / failure["video_id"]).exists()


def test_an_unconfined_worker_is_an_explicit_choice_said_loudly(video_factory, workers, tmp_path):
    """`--unconfined` serves roots no setting allows, says so at start and on each job; the schema still holds."""
    workers.env = {k: v for k, v in workers.env.items() if k not in CONFINED_ENV}
    workers.launch("loose", ["-Q", "cpu", "-n", "loose@test", "--unconfined"])
    wait_until(lambda: workers.state("loose"), 60, "the unconfined worker to register")
    assert "WARNING: this worker is UNCONFINED (--unconfined)" in workers.log("loose")
    raw, out = tmp_path / "raw", tmp_path / "out"
    shutil.copytree(video_factory(1), raw)
    job = {"run_id": "r1", "video_id": "v1", "video": next(p.name for p in raw.iterdir())}
    job.update(dataset_root=str(raw), output_root=str(out), gpus=None, gpu=None)
    url = workers.env["REDIS_URL"]
    served = send_task(url, "framefleet.preprocess", (job,), "cpu", ignore_result=False)
    assert wait_until(lambda: task_result(url, served), 120, "the job")["status"] == "SUCCESS"
    assert "UNCONFINED worker: serving 'v1' of run 'r1'" in workers.log("loose")
    forged = send_task(url, "framefleet.preprocess", ({**job, "video_id": ".."},), "cpu", ignore_result=False)
    assert "job refused: video_id '..'" in refused(url, forged)

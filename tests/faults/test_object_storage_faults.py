"""A worker SIGKILLed while it publishes to an object store (moto's S3 server): nothing torn or half-published."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import yaml

from tasks.outputs import remote
from tests.conftest import ROOT, run_script, wait_until
from tests.faults.conftest import wait_for_summary
from tests.test_object_storage import assert_same_statistics

pytestmark = pytest.mark.slow


def published(s3, bucket: str, prefix: str) -> tuple[dict[str, bytes], dict[str, dict]]:
    """The dataset files under ``prefix`` (key -> bytes) and the markers there (the file they name -> record)."""
    client = s3.client()
    files, markers = {}, {}
    for key in s3.keys(f"s3://{bucket}/{prefix}"):
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{key}")["Body"].read()
        if key.endswith(".hdf5"):
            files[key] = body
        elif key.endswith(".hdf5.done.json"):
            record = json.loads(body)
            markers[record["file"]] = record
    return files, markers


def assert_every_marker_names_its_whole_file(files: dict[str, bytes], markers: dict[str, dict]) -> None:
    for name, record in markers.items():
        assert name in files, f"a marker names {name}, which is not published"
        assert len(files[name]) == record["bytes"] and hashlib.sha256(files[name]).hexdigest() == record["sha256"]


# "marker" stands for the kind in CI: it is the state only framefleet's own code (remote.withdraw) clears.
@pytest.mark.parametrize("kill_at", ["upload", pytest.param("marker", marks=pytest.mark.ci_fault)])
def test_a_worker_killed_while_publishing_leaves_nothing_torn_and_the_run_finishes(
    kill_at, s3, fault_raw, fault_workers, fault_env, reference_stats, tmp_path
):
    bucket = f"kill-{kill_at}"
    raw, out = s3.bucket(bucket) + "/raw", f"s3://{bucket}/out"
    s3.upload_folder(fault_raw, raw)
    fault_workers.start("gpu0")
    dying = fault_workers.start(
        "cpu", env={"FRAMEFLEET_TEST_KILL_AT": kill_at}, extra=("-I", "tests.killed_while_uploading")
    )
    sent = run_script("enqueue_dataset.py", raw, "--out", out, "--no-wait", env=fault_env)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    wait_until(lambda: dying.poll() is not None, 240, "the worker to die while publishing")
    assert "fault point: killed" in fault_workers.log("cpu")

    files, markers = published(s3, bucket, "out")
    assert_every_marker_names_its_whole_file(files, markers)
    unmarked = set(files) - set(markers)
    if kill_at == "upload":  # its parts are on the server, its object is not
        uploads = s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        assert [u["Key"].endswith(".hdf5") for u in uploads] == [True] and not unmarked
    else:  # published, its marker not: not an output for any reader
        assert len(unmarked) == 1

    fault_workers.start("cpu", name="cpu-again")  # what a supervisor does; the lapsed lease sends the task again
    summary = wait_for_summary(remote.mirror_of(out))  # the end's files, as this host's workers wrote them
    files, markers = published(s3, bucket, "out")
    assert_every_marker_names_its_whole_file(files, markers)
    assert set(files) == set(markers) and len(files) == len(list(fault_raw.iterdir()))
    assert summary["failed"] == []
    stats = s3.client().get_object(Bucket=bucket, Key="out/normalization_stats.yaml")["Body"].read()
    assert_same_statistics(yaml.safe_load(stats), reference_stats)

    # --continue from a host that has never seen the run: every video is complete in the bucket, none is sent.
    elsewhere = {**fault_env, "FRAMEFLEET_OBJECT_CACHE": str(tmp_path / "elsewhere")}
    again = run_script("enqueue_dataset.py", raw, "--out", out, "--continue", env=elsewhere)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"nothing to do: every one of the {len(files)} videos" in again.stdout, again.stdout  # none sent
    check = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "verify", out],
        cwd=ROOT,
        env={**fault_env, "FRAMEFLEET_OBJECT_CACHE": str(tmp_path / "fourth")},
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr

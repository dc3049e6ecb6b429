"""Videos in and datasets out on object storage (tasks/outputs/remote.py), against a real S3 server (moto's)."""

from __future__ import annotations

import json

import pytest
import yaml

from tasks.errors import ClaimLost
from tasks.outputs import remote
from tasks.outputs.storage import read_marker, write_marker, write_text_atomic
from tasks.run import seal
from tests.conftest import process_env, run_script
from tests.test_runs import ff

MARKER = "markers/ab/v.hdf5.done.json"


def test_an_exactly_once_output_is_published_once_and_its_marker_after_it(s3, tmp_path):
    url = s3.bucket("once") + "/out"
    out = remote.mirror_of(url)
    dataset = out / "v.hdf5"
    digest = write_text_atomic(dataset, "first")
    assert s3.keys(url) == {"v.hdf5": 5}  # published before the marker that names it
    write_marker(dataset, digest, out / MARKER)
    assert set(s3.keys(url)) == {"v.hdf5", MARKER}

    # A second writer (a run that lost its claim) is refused by the store itself, and changes nothing here either.
    with pytest.raises(ClaimLost, match="published by another writer"):
        write_text_atomic(dataset, "second")
    assert dataset.read_text() == "first"

    # Another host (an empty mirror) trusts the output through the bucket's marker, fetching both.
    for path in (dataset, out / MARKER):
        path.unlink()
    record = read_marker(dataset, out / MARKER)
    assert record is not None and record["sha256"] == digest and dataset.read_text() == "first"

    # The marker gone from the bucket (a forced redo withdrew it): no host trusts the output any longer.
    s3.client().delete_object(Bucket="once", Key=f"out/{MARKER}")
    assert read_marker(dataset, out / MARKER) is None and not (out / MARKER).exists()


def test_an_output_published_without_its_marker_is_withdrawn_by_the_next_claim_holder(s3):
    url = s3.bucket("orphan") + "/out"
    out = remote.mirror_of(url)
    write_text_atomic(out / "v.hdf5", "a writer that died before its marker")
    remote.withdraw(out / "v.hdf5", out / MARKER, replace=False)
    assert s3.keys(url) == {}
    digest = write_text_atomic(out / "v.hdf5", "made again")  # create-only: possible only once it is gone
    write_marker(out / "v.hdf5", digest, out / MARKER)
    remote.withdraw(out / "v.hdf5", out / MARKER, replace=False)  # a complete output stays
    assert set(s3.keys(url)) == {"v.hdf5", MARKER}


def test_intermediates_logs_and_run_keys_stay_on_this_host(s3):
    url = s3.bucket("local") + "/out"
    out = remote.mirror_of(url)
    write_text_atomic(out / "work" / "v" / "depth.done.json", "{}")
    write_text_atomic(out / "logs" / "x.log", "")
    seal.create(out, "r1")  # the run's key: whoever reads the bucket must not be able to seal a job
    write_text_atomic(out / "run_summary.json", "{}")
    assert s3.keys(url) == {"run_summary.json": 2}


def test_an_output_prefix_inside_the_input_prefix_is_refused(monkeypatch, tmp_path):
    from tasks.errors import DatasetError
    from tasks.run.dataset import check_folders

    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path))
    with pytest.raises(DatasetError, match="s3://b/raw/out is inside the input folder s3://b/raw"):
        check_folders(remote.mirror_of("s3://b/raw"), remote.mirror_of("s3://b/raw/out"), False, False)
    check_folders(remote.mirror_of("s3://b/raw"), remote.mirror_of("s3://b/raw-out"), False, False)


def test_a_missing_bucket_or_wrong_credentials_stop_before_anything_is_sent(s3, tmp_path):
    raw = s3.bucket("there") + "/raw"
    env = process_env("redis://127.0.0.1:1/0")  # no Redis: the bucket is checked first
    missing = ff("enqueue", raw, "--out", "s3://no-such-bucket/out", env=env)
    assert missing.returncode == 2
    assert "bucket 'no-such-bucket'" in missing.stderr and "does not exist" in missing.stderr
    assert "aws s3 mb s3://no-such-bucket" in missing.stderr

    wrong = ff("enqueue", raw, "--out", raw + "-out", env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert wrong.returncode == 2
    assert "bucket 'there'" in wrong.stderr and "refuses these credentials" in wrong.stderr
    assert "AWS_ACCESS_KEY_ID" in wrong.stderr and "wrong" not in wrong.stderr.replace("refuses", "")

    silent = ff("enqueue", raw, "--out", raw + "-out", env={**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:1"})
    assert silent.returncode == 2
    assert "bucket 'there' at http://127.0.0.1:1 does not answer" in silent.stderr
    assert "AWS_ENDPOINT_URL" in silent.stderr


def assert_same_statistics(got: dict, want: dict) -> None:
    """Two normalization_stats.yaml mappings equal but for float64 rounding (pooled in another order)."""
    assert got.keys() == want.keys()
    for key, value in want.items():
        pairs = zip(got[key], value, strict=True) if isinstance(value, list) else [(got[key], value)]
        for a, b in pairs:
            assert a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b)), (key, a, b)


def test_a_run_from_s3_to_s3_equals_the_same_run_on_local_disk_and_verifies(s3, video_factory, workers, tmp_path):
    folder = video_factory(2)
    raw = s3.bucket("data") + "/raw"
    out = "s3://data/out"
    s3.upload_folder(folder, raw)
    workers.start("cpu", wait=False)
    workers.start("gpu0")
    local = run_script("enqueue_dataset.py", str(folder), "--out", str(tmp_path / "local"), env=workers.env)
    assert local.returncode == 0, local.stdout + local.stderr

    run = run_script("enqueue_dataset.py", raw, "--out", out, env=workers.env)
    assert run.returncode == 0, run.stdout + run.stderr
    keys = s3.keys(out)
    ids = {p.stem for p in (tmp_path / "local").glob("*.hdf5")}
    assert len(ids) == 2 and {k[:-5] for k in keys if k.endswith(".hdf5")} == ids
    for name in ("normalization_stats.yaml", "run_summary.json", "manifest.json", "report.html"):
        assert name in keys, sorted(keys)
    assert not any(k.startswith(("work/", "logs/")) or k.endswith(".key") for k in keys), sorted(keys)
    assert f"outputs in {out}" in run.stdout  # the URL a user gave, not this host's copy
    # The credentials are in no published file and no log.
    secret = s3.env["AWS_SECRET_ACCESS_KEY"].encode()
    for key in keys:
        assert secret not in s3.client().get_object(Bucket="data", Key=f"out/{key}")["Body"].read(), key
    assert not [p for p in workers.logs.rglob("*.log") if secret in p.read_bytes()]
    got = s3.client().get_object(Bucket="data", Key="out/normalization_stats.yaml")["Body"].read().decode()
    assert_same_statistics(
        yaml.safe_load(got), yaml.safe_load((tmp_path / "local" / "normalization_stats.yaml").read_text())
    )
    summary = json.loads(s3.client().get_object(Bucket="data", Key="out/run_summary.json")["Body"].read())
    assert summary["done"] == summary["statistics_videos"] == 2 and summary["failed"] == []

    # verify and videos read the bucket as another host would: from an empty object cache.
    elsewhere = {**workers.env, "FRAMEFLEET_OBJECT_CACHE": str(tmp_path / "elsewhere")}
    check = ff("verify", out, env=elsewhere)
    assert check.returncode == 0, check.stdout + check.stderr
    run_id = summary["run_id"]
    status = ff("status", "--out", out, env={**elsewhere, "FRAMEFLEET_OBJECT_CACHE": str(tmp_path / "status")})
    assert status.returncode == 0 and run_id in status.stdout, status.stdout + status.stderr
    listed = ff("videos", out, env={**elsewhere, "FRAMEFLEET_OBJECT_CACHE": str(tmp_path / "third")})
    assert listed.returncode == 0, listed.stderr
    assert {(v["video_id"], v["status"]) for v in map(json.loads, listed.stdout.splitlines())} == {
        (vid, "done") for vid in ids
    }

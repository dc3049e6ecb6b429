"""The job message: a typed value inside, the same JSON dict on the wire as earlier versions sent."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tasks.errors import BadJobMessage
from tasks.job import Failure, Job, StageTiming

# A job as build_chord of earlier versions wrote it, then as it left the depth stage after an
# out-of-memory retry, and as a failed chain's last stage returned it.
ENQUEUED = {
    "run_id": "20261126-110102-c8400d",
    "video_id": "clip_00-23068ef4cb",
    "video": "kitchen/clip 00.mp4",
    "dataset_root": "/data/raw",
    "output_root": "/data/out",
    "gpus": [0, 1],
    "gpu": None,
    "force": False,
    "intermediates": "drop",
    "text": "pick up the cup",
    "noun": "cup",
    "chain": ["preprocess", "depth", "tracks", "hands", "h5"],
}
AFTER_OOM = {
    **ENQUEUED,
    "gpu": 1,
    "timings": {
        "preprocess": {"start": 1.5, "end": 2.25, "worker": "cpu@a", "skipped": False, "run_s": 0.5},
        "depth": {"start": 3.0, "end": 4.0, "worker": "gpu1@a", "skipped": True, "run_s": 0.0},
    },
    "notes": {"depth": {"backend": "synthetic", "fov_deg": 60.0}},
    "chunk_scale": 0.25,
    "avoid_gpu": 0,
    "oom_peak_mib": 20480.5,
    "claim_waits": 2,
}
FAILED = {
    **AFTER_OOM,
    "report": {"frames": 48},
    "failed": {
        "stage": "hands",
        "error_class": "GpuOutOfMemory",
        "reason": "CUDA out of memory",
        "attempts": 3,
        "worker": "gpu1@a",
        "time": 5.0,
    },
}


@pytest.mark.parametrize("message", [ENQUEUED, AFTER_OOM, FAILED], ids=["enqueued", "after-oom", "failed"])
def test_an_earlier_versions_message_reads_and_writes_back_unchanged(message):
    job = Job.from_dict(json.loads(json.dumps(message)))
    assert job.to_dict() == message
    assert json.loads(json.dumps(job.to_dict())) == message
    assert Job.from_dict(job.to_dict()) == job


def test_the_fields_are_typed_values():
    job = Job.from_dict(FAILED)
    assert job.chain == ("preprocess", "depth", "tracks", "hands", "h5") and job.gpus == (0, 1)
    assert job.timings["preprocess"] == StageTiming(1.5, 2.25, "cpu@a", False, 0.5)
    assert job.failed == Failure("hands", "GpuOutOfMemory", "CUDA out of memory", 3, "gpu1@a", 5.0)
    assert job.notes["depth"]["fov_deg"] == 60.0 and job.report == {"frames": 48}
    assert (job.chunk_scale, job.avoid_gpu, job.oom_peak_mib, job.claim_waits) == (0.25, 0, 20480.5, 2)


def test_a_fresh_job_leaves_out_what_no_stage_has_set_and_defaults_what_is_absent():
    job = Job.from_dict(ENQUEUED)
    assert (job.timings, job.notes, job.report, job.failed) == ({}, {}, None, None)
    assert (job.chunk_scale, job.avoid_gpu, job.oom_peak_mib, job.claim_waits) == (1.0, None, 0.0, 0)
    evolved = dataclasses.replace(job, claim_waits=1)
    assert evolved.to_dict() == {**ENQUEUED, "claim_waits": 1}
    assert dataclasses.replace(evolved, claim_waits=0).to_dict() == ENQUEUED


def test_nulls_and_an_empty_failure_read_as_defaults_as_earlier_versions_did():
    job = Job.from_dict({**ENQUEUED, "chain": None, "failed": {}, "chunk_scale": None, "notes": None})
    assert job.chain == () and job.failed is None and job.chunk_scale == 1.0 and job.notes == {}


def test_a_timing_without_run_s_reads_as_zero():
    old = {"start": 1.0, "end": 2.0, "worker": "cpu@a", "skipped": False}
    assert Job.from_dict({**ENQUEUED, "timings": {"h5": old}}).timings["h5"].run_s == 0.0


def test_keys_this_version_does_not_know_are_kept_and_written_back():
    newer = {**ENQUEUED, "priority": 7, "trace": {"id": "abc"}}
    job = Job.from_dict(newer)
    assert job.extra == {"priority": 7, "trace": {"id": "abc"}}
    assert dataclasses.replace(job, gpu=1).to_dict() == {**newer, "gpu": 1}


@pytest.mark.parametrize("key", ["run_id", "video_id", "video", "dataset_root", "output_root"])
def test_a_message_missing_a_required_key_is_refused_naming_it(key):
    with pytest.raises(BadJobMessage, match=f"lacks '{key}'"):
        Job.from_dict({k: v for k, v in ENQUEUED.items() if k != key})


def test_malformed_fields_are_refused_naming_the_record():
    with pytest.raises(BadJobMessage, match="failure record lacks 'error_class'"):
        Job.from_dict({**ENQUEUED, "failed": {"stage": "h5"}})
    with pytest.raises(BadJobMessage, match="stage timing lacks 'end'"):
        Job.from_dict({**ENQUEUED, "timings": {"h5": {"start": 1.0}}})
    with pytest.raises(BadJobMessage, match="malformed"):
        Job.from_dict({**ENQUEUED, "gpus": 3})
    with pytest.raises(BadJobMessage, match="JSON object"):
        Job.from_dict(["not", "a", "job"])  # type: ignore[arg-type]


def test_peek_takes_any_message_with_a_run_and_a_video_and_nothing_else():
    assert Job.peek({"run_id": "r", "video_id": "v"}) == Job("r", "v")
    assert Job.peek({"run_id": "r"}) is None
    assert Job.peek([{"run_id": "r", "video_id": "v"}]) is None  # the chord callback's results
    assert Job.peek(None) is None

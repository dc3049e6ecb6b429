"""The job message: a typed value inside, the same JSON dict on the wire as earlier versions sent."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from tasks.errors import BadJobMessage
from tasks.job import Failure, Job, StageTiming
from tests.conftest import send_task, task_result, wait_until

ROOT = Path(__file__).resolve().parents[1]

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


def test_no_module_but_tasks_job_reads_a_job_dict_by_key():
    """Every job read goes through the typed Job: no ``job["..."]``, ``job.get(...)`` or ``job.pop(...)``."""
    pattern = re.compile(r"""\b(job|payload)\s*(\[\s*["']|\.get\(|\.pop\()|\(job or \{\}\)\.get\(""")
    offending = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "tasks").rglob("*.py"))
        if path.name != "job.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offending, "\n".join(offending)


def test_a_worker_runs_an_earlier_versions_message_and_keeps_its_unknown_keys(
    video_factory, workers, pipeline_env, tmp_path
):
    raw = video_factory(1)
    out = tmp_path / "out"
    workers.start("cpu")
    video = next(raw.iterdir()).name
    waiting = {**ENQUEUED, "video": video, "dataset_root": str(raw), "output_root": str(out), "priority": 7}
    url = pipeline_env["REDIS_URL"]
    # A stage before the last stores no result unless asked (the next stage's message carries it).
    ok = send_task(url, "framefleet.preprocess", (waiting,), "cpu", ignore_result=False)
    cut = send_task(url, "framefleet.preprocess", ({k: v for k, v in waiting.items() if k != "output_root"},), "cpu")
    done = wait_until(lambda: task_result(url, ok), 60, "the preprocess result")
    assert done["status"] == "SUCCESS", done
    result = done["result"]
    assert {k: v for k, v in result.items() if k != "timings"} == waiting
    assert set(result["timings"]) == {"preprocess"} and not result["timings"]["preprocess"]["skipped"]
    assert (out / "work" / waiting["video_id"] / "preprocess.npz").is_file()
    refused = wait_until(lambda: task_result(url, cut), 60, "the refusal")
    assert refused["status"] == "FAILURE" and refused["result"]["exc_type"] == "BadJobMessage", refused
    assert "lacks 'output_root'" in refused["result"]["exc_message"][0]


def test_the_end_of_progress_leaves_a_stored_result_to_celery_when_the_call_asks_for_one(app_on_test_redis):
    """A stage that showed progress removes its PROGRESS state only when Celery will store no result.

    A call that asks for the result (``apply_async(..., ignore_result=False)`` on a stage that
    ignores it by default) gets the stage's real result; otherwise nothing of the task stays in
    Redis (a PROGRESS state left there would be kept result_expires_s).
    """
    from tasks.celery_app import app
    from tasks.pipeline import STAGE_TASKS, progress

    task = app.tasks["framefleet.preprocess"]
    assert all(t.ignore_result for t in STAGE_TASKS.values())  # no stage stores its result by default
    job = Job.from_dict({**ENQUEUED, "dataset_root": "/d", "output_root": "/o"})
    for task_id, asked in (("asked-for", False), ("default", None)):
        options = {} if asked is None else {"ignore_result": asked}
        task.push_request(id=task_id, **options)
        task.update_state(state="PROGRESS", meta={"done": 1, "total": 2})
        progress.PROGRESS_STORED.add(task_id)
        try:
            progress.end_progress(task, job)
        finally:
            task.pop_request()
            progress.PROGRESS_STORED.discard(task_id)
    assert task.AsyncResult("asked-for").state == "PROGRESS"  # left for Celery's own SUCCESS
    _, r = app_on_test_redis
    assert not r.exists("celery-task-meta-default")  # nothing of it kept
    assert task.AsyncResult("default").state == "PENDING"
    # A retried task's RETRY state (stored even for an ignored result) goes the same way at its end.
    task.push_request(id="retried", retries=1)
    try:
        task.update_state(state="RETRY", meta={"exc_type": "OutOfMemory"})
        progress.end_progress(task, job)
    finally:
        task.pop_request()
    assert not r.exists("celery-task-meta-retried")

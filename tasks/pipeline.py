"""One task per stage of tasks.stages: thin wrappers that skip finished work, run a stage, write atomically."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Task, current_task
from celery.app.task import get_actual_ignore_result
from celery.exceptions import Ignore, Reject

from tasks import oom
from tasks.celery_app import TASK_PREFIX, app, settings
from tasks.delivery import claims, leases
from tasks.delivery.routing import route_task
from tasks.errors import (
    ClaimLost,
    FramefleetError,
    GpuOutOfMemory,
    PermanentError,
    RedisUnavailable,
    RetryableError,
    TransientIO,
    WorkerLost,
    error_class,
)
from tasks.job import Failure, Job, StageTiming
from tasks.observe import metrics, progress
from tasks.observe.flower_view import VideoTask, finished_earlier, progress_text
from tasks.outputs import intermediates
from tasks.outputs.stage_io import check_roots, gather_inputs, marker_of, output_path, read_done
from tasks.outputs.storage import atomic_write, clear_temporaries, save_npz, write_marker
from tasks.redis_client import get_redis
from tasks.run import cancel, completion, partials
from tasks.stages import STAGE_NAMES, dataset_stage, stage_class
from tasks.workers import worker

log = logging.getLogger("framefleet.pipeline")
PROGRESS_EVENT_INTERVAL_S = 0.5  # at most 2 task-progress events a second per task
PROGRESS_STORED: set[str] = set()  # ids of this process's running tasks whose PROGRESS state was stored


def _as_framefleet_error(exc: Exception) -> FramefleetError | Exception:
    # torch is not imported here; its OOM error is recognised by name.
    if type(exc).__name__ == "OutOfMemoryError":
        return GpuOutOfMemory(str(exc).splitlines()[0] if str(exc) else "CUDA out of memory", 10.0)
    if isinstance(exc, OSError) and not isinstance(exc, FramefleetError):
        where = f" {exc.filename}" if exc.filename else ""
        return TransientIO(
            f"cannot read or write{where}: {exc.strerror or exc} (a full disk, a read-only "
            "or unmounted output folder, or a file in the way); retrying",
            10.0,
        )
    return exc


def _execute(stage_name: str, job: Job, fence: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run one stage for ``job`` unless its valid output exists; return what the stage reports.

    ``fence`` is called before the output and its marker are published; what it raises discards them.
    """
    check_roots(job, settings())
    out_root = Path(job.output_root)
    vid = job.video_id
    output = output_path(out_root, vid, stage_name)
    marker = marker_of(out_root, vid, stage_name)
    if not job.force:
        done = read_done(out_root, vid, stage_name)
        if done is not None:
            return {"skipped": True, **done.get("report", {})}
    stage = worker.get_stage(stage_name)
    oom.set_chunk_scale(stage, float(job.chunk_scale))
    for leftover in (output, marker):  # a worker (or a whole host) killed mid-write leaves its temporary behind
        if cleared := clear_temporaries(leftover):
            log.warning("removed %d temporary file(s) of %s left by a writer that died", cleared, leftover.name)

    seen = _stamp(marker)  # the marker as this run found it (absent, or a damaged output's)

    def fence_output() -> None:
        # A run that lost its claim for a while may find the stage finished by the run that took over:
        # a marker written since this run looked is another run's completion.
        if not job.force and _stamp(marker) not in (None, seen):
            raise ClaimLost(f"{stage_name} of {vid} was completed by another run meanwhile; output discarded")
        if fence is not None:
            fence()

    inputs = gather_inputs(stage_name, job, chain_of(job))
    report: dict[str, Any] = {}
    # The first event waits as long as the next ones: a task shorter than the interval sends none
    # (each event is an event publish plus a state write, 2-3 Redis round trips per task).
    last_sent = [time.monotonic()]
    # No ping first: the client connects lazily and the checker treats a Redis error as "not cancelled".
    check_cancelled = cancel.Checker(get_redis(settings().redis_url), job.run_id)

    def on_progress(done_frames: int, total_frames: int) -> None:
        check_cancelled()  # `framefleet cancel`: stop here, before the output is written
        worker.STATE.update(frames=[done_frames, total_frames])
        if time.monotonic() - last_sent[0] >= PROGRESS_EVENT_INTERVAL_S:
            last_sent[0] = time.monotonic()
            _announce_progress(
                {
                    "video_id": vid,
                    "video": job.video,
                    "stage": stage_name,
                    "done": done_frames,
                    "total": total_frames,
                }
            )

    ran_s = 0.0
    if stage_class(stage_name).writes == "hdf5":

        def write(tmp: Path) -> None:
            nonlocal ran_s
            began = time.perf_counter()
            report.update(stage.run({**inputs, "out_path": str(tmp)}, progress=on_progress))
            ran_s = time.perf_counter() - began

        digest = atomic_write(output, write, fence_output)
    else:
        began = time.perf_counter()
        arrays = stage.run(inputs, progress=on_progress)
        ran_s = time.perf_counter() - began
        notes = arrays.pop("notes", None)  # facts for the run summary, not arrays
        if notes:
            report["notes"] = notes
        digest = save_npz(output, arrays, fence_output)
    write_marker(output, digest, marker, fence, report=report)
    worker.note_committed()
    log.info("ran %s of %s", stage_name, vid)
    # Seconds inside the stage's own run (the model), apart from input loading and atomic writes;
    # added after the marker is written, so a marker stays the same whoever made it.
    return {**report, "run_s": ran_s}


def _stamp(path: Path) -> tuple[int, int] | None:
    """A file's (modification time ns, size), or None when there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def chain_of(job: Job) -> tuple[str, ...]:
    """The stages this job's video runs (decided at enqueue), or this worker's enabled stages."""
    return tuple(job.chain or settings().enabled_stages())


def _announce_progress(meta: dict[str, Any]) -> None:
    """Send ``meta`` as a task-progress event and as the task's PROGRESS state, for Flower; never raises."""
    task = current_task._get_current_object()
    if task is None or task.request.called_directly:
        return
    try:
        task.send_event("task-progress", result=progress_text(meta), **meta)
        task.update_state(state="PROGRESS", meta=meta)
        PROGRESS_STORED.add(task.request.id)
    except Exception as exc:  # progress display is not worth failing a video for
        log.warning("progress of %s not sent: %s", task.request.id, exc)


def _end_progress(task: Task, job: Job) -> None:
    """Replace the PROGRESS state of a task whose result is not stored by SUCCESS (a short record); never raises.

    Without it a result reader would see such a task in PROGRESS for good; tasks that sent no
    progress (shorter than PROGRESS_EVENT_INTERVAL_S) have no state to replace and write nothing.
    """
    # The per-call ignore_result (apply_async(..., ignore_result=False)) overrides the task's own.
    if task.request.id not in PROGRESS_STORED or not get_actual_ignore_result(task, task.request):
        return  # nothing to replace, or Celery stores this task's end itself
    try:
        task.update_state(state="SUCCESS", meta={"video_id": job.video_id, "stage": task.name})
    except Exception as exc:
        log.warning("end of %s not stored: %s", task.request.id, exc)


def _redis_or_none(url: str) -> Any:
    """A client for ``url`` that has answered a ping, or None (the client connects lazily)."""
    try:
        client = get_redis(url)
        client.ping()
        return client
    except Exception:
        return None


def _count_start(task: Task, ttl_s: int) -> int:
    """Count the starts of this task id (retries and redeliveries alike), so nothing loops forever."""
    key = keys.ATTEMPTS_PREFIX + task.request.id
    try:
        r = get_redis(settings().redis_url)
        pipe = r.pipeline()
        pipe.incr(key)
        pipe.expire(key, ttl_s)
        return int(pipe.execute()[0])
    except Exception as exc:
        log.warning("start of %s not counted: %s", task.request.id, exc)
        return task.request.retries + 1


def _claim_or_wait(task: Task, key: str, stage_name: str, job: Job) -> None:
    """Claim this video's stage, or drop a duplicate delivery, or wait for another run of it.

    Raises Retry (wait, or Redis did not answer), Ignore (a duplicate), or Reject when the
    retry itself could not be sent.
    """
    conf = settings()
    try:
        verdict = claims.decide(
            get_redis(conf.redis_url),
            key,
            task.request.id,
            task.request.hostname,
            conf.lease_ttl_s,
            cancel_key=cancel.flag_key(job.run_id),  # `framefleet cancel`: checked in the same round trip
        )
    except redis.RedisError as exc:
        log.warning(
            "%s of %s: Redis did not answer the claim (%s); retrying in %g s",
            stage_name,
            job.video_id,
            exc,
            conf.lease_ttl_s / 2,
        )
        _wait(task, job, conf.lease_ttl_s / 2)
    if verdict.action == "run":
        return
    if verdict.action == "cancelled":
        cancel.stop(task, stage_name, job)
    if verdict.action == "drop":
        log.warning(
            "dropped a second delivery of task %s (%s of %s): %s",
            task.request.id,
            stage_name,
            job.video_id,
            verdict.why,
        )
        leases.dropped_duplicate(task.request.id)
        if not verdict.holder:  # it finished in an earlier delivery, whose end Flower may not have seen
            finished_earlier(task)
        raise Ignore()
    log.info(
        "%s of %s is being made by %s; looking again in %g s",
        stage_name,
        job.video_id,
        verdict.holder,
        conf.lease_ttl_s / 2,
    )
    _wait(task, job, conf.lease_ttl_s / 2)


def _wait(task: Task, job: Job, countdown_s: float) -> None:
    """Send this task again after ``countdown_s``; waiting does not use up its retries for failures."""
    waits = job.claim_waits + 1
    _retry_later(task, dataclasses.replace(job, claim_waits=waits), countdown_s, max_retries=task.request.retries + 1)


def _failed_tries(task: Task, job: Job) -> int:
    """How many earlier tries of this task failed (Celery's retry count, less the retries that waited)."""
    return task.request.retries - job.claim_waits


def _retry_later(
    task: Task, job: Job, countdown_s: float, max_retries: int | None = None, exc: Exception | None = None
) -> None:
    # Celery sends a retry back to the queue it came from; route it afresh instead, at the stage's priority.
    payload = job.to_dict()
    route = route_task(task.name, (payload,), {}, {})
    queue = route["queue"]
    raise task.retry(
        args=(payload,),
        exc=exc,
        countdown=countdown_s,
        max_retries=max_retries,
        priority=route.get("priority"),
        queue=queue,
        exchange=queue,
        routing_key=queue,
    )


def run_stage(task: Task, stage_name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Run ``stage_name`` for the job message ``payload`` and return the job for the next stage, or a failure record.

    A Redis error anywhere here becomes a retry of this task, or, when not even the retry can
    be sent, a failure record for this one video: never an exception that ends the video's chain.
    The chain's last stage counts the video as finished in its run, a success or a failure record.
    A message lacking a key it needs raises BadJobMessage.
    """
    given = job = Job.from_dict(payload)
    if not job.failed:
        try:
            job = _run_stage(task, stage_name, job)  # a cancelled run stops at the claim, before any work
            _end_progress(task, job)
        finally:
            PROGRESS_STORED.discard(task.request.id)
        job = dataclasses.replace(job, claim_waits=0)  # the next stage counts its own
    if stage_name == chain_of(job)[-1]:
        _video_ended(task, given, job)
    return job.to_dict()


def _video_ended(task: Task, given: Job, job: Job) -> None:
    """Count the video as finished in its run (tasks.run.completion); a Redis or broker error retries this
    task with the job it was ``given`` (the stage then finds its output made, and counts again)."""
    conf = settings()
    try:
        completion.video_ended(get_redis(conf.redis_url), job, conf.result_expires_s, sender=task.request.id)
    except Exception as exc:
        log.warning("end of %s not counted in run %s (%s); retrying", job.video_id, job.run_id, exc)
        _retry_later(task, given, 10.0, max_retries=task.request.retries + 1)


def _run_stage(task: Task, stage_name: str, job: Job) -> Job:
    conf = settings()
    key = claims.claim_key(job.output_root, job.video_id, stage_name)
    try:
        _claim_or_wait(task, key, stage_name, job)
    except Reject as exc:
        return _failed(
            task,
            stage_name,
            job,
            RedisUnavailable(
                f"{stage_name} of {job.video}: Redis did not answer and the task could not be retried "
                f"({exc.reason}); enqueue again with --continue once Redis is back"
            ),
            _failed_tries(task, job) + 1,
        )
    started = time.time()
    attempts = _failed_tries(task, job) + 1
    try:
        attempts = _count_start(task, claims.marks_ttl_s(conf.visibility_timeout_s))
        stage_conf = conf.stages[stage_name]
        if attempts > stage_conf.max_retries + 1:
            raise WorkerLost(
                f"{stage_name} of {job.video} was started {attempts - 1} times without finishing: "
                f"its worker died or passed the {stage_conf.deadline_s:g} s deadline each time"
            )
        report = _execute(stage_name, job, lambda: claims.confirm(get_redis(conf.redis_url), key, conf.lease_ttl_s))
    except cancel.RunCancelled:
        cancel.stop(task, stage_name, job)
    except ClaimLost as exc:
        # Another run took this stage over while ours was cut off; that run publishes and continues the chain.
        log.warning("%s of %s: %s; dropping this run", stage_name, job.video_id, exc)
        raise Ignore() from exc
    except Exception as exc:
        job = _after_failure(task, stage_name, job, _as_framefleet_error(exc), attempts)
    else:
        timing = StageTiming(
            start=started,
            end=time.time(),
            worker=task.request.hostname,
            skipped=bool(report.get("skipped")),
            run_s=report.get("run_s", 0.0),
        )
        job = dataclasses.replace(job, timings={**job.timings, stage_name: timing})
        if worker.ROLE.gpu is not None:
            job = dataclasses.replace(job, gpu=worker.ROLE.gpu)
        if stage_class(stage_name).writes == "hdf5":
            job = dataclasses.replace(job, report={k: v for k, v in report.items() if k not in ("stats", "run_s")})
            _keep_partial(job, stage_name, report)
            if job.intermediates == "drop":
                _drop_intermediates(job)
        if report.get("notes"):
            job = dataclasses.replace(job, notes={**job.notes, stage_name: report["notes"]})
        _record(task, stage_name, job, ok=True)
    return job


def _after_failure(task: Task, stage_name: str, job: Job, failure: Exception, attempts: int) -> Job:
    """Retry a retryable failure (raises Retry), else return the job with its failure record."""
    conf = settings()
    stage_conf = conf.stages[stage_name]
    retryable = not isinstance(failure, PermanentError)
    if isinstance(failure, GpuOutOfMemory):
        # Retry elsewhere if possible, with smaller chunks; the autoscaler reads the record.
        job = oom.after_oom(
            _redis_or_none(conf.redis_url),
            stage_name,
            worker.STAGES.get(stage_name),
            job,
            worker.ROLE.gpu,
            task.request.hostname,
            str(failure),
        )
        failure = GpuOutOfMemory(
            f"{failure} (peak {job.oom_peak_mib:.0f} MiB; chunk scale now {job.chunk_scale:g})", failure.delay_s
        )
    failed_tries = _failed_tries(task, job)
    if retryable and failed_tries < stage_conf.max_retries:
        delay = failure.delay_s if isinstance(failure, RetryableError) else 5.0
        log.warning(
            "%s of %s failed (%s: %s); retry %d of %d",
            stage_name,
            job.video_id,
            error_class(failure),
            failure,
            attempts,
            stage_conf.max_retries,
        )
        try:
            _retry_later(task, job, delay * 2**failed_tries, job.claim_waits + stage_conf.max_retries, failure)
        except Reject as exc:
            failure = RedisUnavailable(f"{failure}; and the retry could not be sent ({exc.reason})")
    return _failed(task, stage_name, job, failure, attempts)


def _failed(task: Task, stage_name: str, job: Job, failure: Exception, attempts: int) -> Job:
    log.error("%s of %s failed for good: %s: %s", stage_name, job.video_id, error_class(failure), failure)
    job = dataclasses.replace(
        job,
        failed=Failure(
            stage=stage_name,
            error_class=error_class(failure),
            reason=str(failure),
            attempts=attempts,
            worker=task.request.hostname,
            time=time.time(),
        ),
    )
    _record(task, stage_name, job, ok=False)
    return job


def _record(task: Task, stage_name: str, job: Job, ok: bool) -> None:
    """Count the stage in the run's progress and the metrics; never raises.

    A stage before the last that succeeded leaves the writes to its end (worker.on_task_end), where
    they share the round trip that releases its claim, after Celery has sent the next stage: off the
    chain's path. The dataset stage and a failure write them now, before the task returns: the
    video's end can start the run's callback (tasks.run.completion), which reads the counters and the
    stage log, and a failed video reaches its chain's end at once.
    """
    conf = settings()

    def queue(pipe: Any) -> None:
        progress.add(pipe, job.run_id, stage_name, ok, conf.result_expires_s)
        try:
            metrics.add_stage(pipe, stage_name, job)
        except Exception as exc:  # a job without the entry's fields: the progress still counts
            log.warning("metrics of %s not recorded: %s", stage_name, exc)

    if ok and stage_name != dataset_stage().name and not task.request.called_directly and task.request.id:
        worker.AT_END[task.request.id] = queue
        return
    try:
        pipe = get_redis(conf.redis_url).pipeline(transaction=False)
        queue(pipe)
        pipe.execute()
    except Exception as exc:  # progress display and metrics are not worth failing a video for
        log.warning("progress and metrics of %s not recorded: %s", stage_name, exc)


def _keep_partial(job: Job, stage_name: str, report: dict[str, Any]) -> None:
    """Copy the video's partial statistics to Redis for the statistics callback (tasks.run.partials); never
    raises: without the copy the callback reads the marker."""
    if "stats" not in report:
        return
    conf = settings()
    out_root = Path(job.output_root)
    try:
        output = output_path(out_root, job.video_id, stage_name)
        partials.keep(get_redis(conf.redis_url), out_root, job.video_id, output, report["stats"], conf.result_expires_s)
    except Exception as exc:
        log.warning("partial statistics of %s not kept in Redis: %s", job.video_id, exc)


def _drop_intermediates(job: Job) -> None:
    """Delete a finished video's OUT/work/ folder (``--intermediates drop``); a failure is only logged."""
    try:
        freed = intermediates.drop(Path(job.output_root), job.video_id)
        log.info("dropped the intermediates of %s (%d bytes)", job.video_id, freed)
    except OSError as exc:  # the dataset file is complete; leftovers are for `framefleet clean`
        log.warning("intermediates of %s not dropped: %s", job.video_id, exc)


def _stage_task(stage_name: str) -> Task:
    def body(self: Task, job: dict[str, Any]) -> dict[str, Any]:
        return run_stage(self, stage_name, job)

    body.__name__ = stage_name
    body.__doc__ = f"Run the {stage_name} stage for one video; return the job for the next stage."
    # Only the last stage's result is read (it feeds the run's chord, tasks/run/dataset.py build_chord); a
    # chain hands every other result to the next task in its message. Not storing those saves two
    # result-backend writes per transition (the result, and the STARTED state: Celery's trace skips
    # track_started for an ignored result, celery/app/trace.py build_tracer). update_state (PROGRESS,
    # REVOKED) still writes, and failures are stored. Revert: drop ignore_result when the chord goes.
    ignored = stage_name != dataset_stage().name
    return app.task(
        bind=True,
        name=TASK_PREFIX + stage_name,
        acks_late=True,
        base=VideoTask,
        ignore_result=ignored,
        store_errors_even_if_ignored=True,
    )(body)


# One task per stage, named framefleet.<stage>.
STAGE_TASKS: dict[str, Task] = {name: _stage_task(name) for name in STAGE_NAMES}

from tasks import keys  # noqa: F401
from tasks.run import aggregate  # noqa: F401

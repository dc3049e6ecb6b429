"""Run one stage for one video unless its valid output made under the same settings exists, and publish
the output atomically, its marker naming the settings' hash."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks.celery_app import settings
from tasks.errors import ClaimLost
from tasks.job import Job
from tasks.outputs import provenance, remote
from tasks.outputs.stage_io import UPSTREAM_KEY, check_roots, gather_inputs, marker_of, output_path, read_done
from tasks.outputs.storage import atomic_write, clear_temporaries, save_npz, write_marker
from tasks.pipeline import quality
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.stages import stage_class
from tasks.workers import worker

log = logging.getLogger("framefleet.pipeline")


def chain_of(job: Job) -> tuple[str, ...]:
    """The stages this job's video runs (decided at enqueue), or this worker's enabled stages."""
    return tuple(job.chain or settings().enabled_stages())


def execute(call: StageCall, hooks: Sequence[StageHook] = ()) -> dict[str, Any]:
    """Run ``call``'s stage unless its valid output exists; return what the stage reports.

    The hooks' ``fence`` is called before the output and its marker are published; what it raises
    discards them. Their ``before_run`` and ``on_progress`` are called around the stage's ``run``.
    """
    stage_name, job = call.stage_name, call.job
    check_roots(job, settings())
    out_root = Path(job.output_root)
    vid = job.video_id
    output = output_path(out_root, vid, stage_name)
    marker = marker_of(out_root, vid, stage_name)
    made_with = worker.stage_settings(stage_name)["sha256"]  # the run's, when its job names them (same_settings)
    replacing = job.force
    if not job.force:
        done = read_done(out_root, vid, stage_name)
        if done is not None and done.get("settings", made_with) == made_with:
            _gate(stage_name, done.get("report", {}))  # the thresholds may have changed since it was made
            return {"skipped": True, **done.get("report", {})}
        if done is not None:  # made under other settings (an earlier run's): this run's are made anew
            replacing = True
            log.info("redoing %s of %s, made under other settings (%.12s)", stage_name, vid, done["settings"])
    stage = worker.get_stage(stage_name)
    for hook in hooks:
        hook.before_run(call, stage)
    for leftover in (output, marker):  # a worker (or a whole host) killed mid-write leaves its temporary behind
        if cleared := clear_temporaries(leftover):
            log.warning("removed %d temporary file(s) of %s left by a writer that died", cleared, leftover.name)
    # An object store's form of the same (tasks.outputs.remote): an output published without its marker.
    remote.withdraw(output, marker, replace=replacing)

    seen = _stamp(marker)  # the marker as this run found it (absent, or a damaged output's)

    def fence() -> None:
        for hook in hooks:
            hook.fence(call)

    def fence_output() -> None:
        # A run that lost its claim for a while may find the stage finished by the run that took over:
        # a marker written since this run looked is another run's completion. The claim is confirmed
        # first: a confirm answered only once a cut-off host is back (seconds later) may find the claim
        # free again and take it, and only from then can no other run publish, so the marker is read after.
        fence()
        if not job.force and _stamp(marker) not in (None, seen):
            raise ClaimLost(f"{stage_name} of {vid} was completed by another run meanwhile; output discarded")

    def on_progress(done_frames: int, total_frames: int) -> None:
        for hook in hooks:
            hook.on_progress(call, done_frames, total_frames)

    inputs = gather_inputs(stage_name, job, chain_of(job))
    meta = provenance.begin(stage_name, stage, job, settings(), inputs.pop(UPSTREAM_KEY, None))
    report: dict[str, Any] = {}
    ran_s = 0.0
    if stage_class(stage_name).writes == "hdf5":

        def write(tmp: Path) -> None:
            nonlocal ran_s
            began = time.perf_counter()
            report.update(stage.run({**inputs, "provenance": meta, "out_path": str(tmp)}, progress=on_progress))
            ran_s = time.perf_counter() - began

        digest = atomic_write(output, write, fence_output)
        report.update(quality=meta["quality"], provenance=provenance.summary(meta))
    else:
        began = time.perf_counter()
        arrays = stage.run(inputs, progress=on_progress)
        ran_s = time.perf_counter() - began
        if not stage_class(stage_name).reads:  # the source stage: a video too short is refused before any model
            quality.check_length(job.video, len(arrays["frames"]), chain_of(job), settings())
        notes = arrays.pop("notes", None)  # facts for the run summary, not arrays
        if notes:
            report["notes"] = notes
        report["quality"] = provenance.finish(meta, stage_name, arrays.pop("quality", None))
        arrays[provenance.META_KEY] = provenance.encode(meta)
        digest = save_npz(output, arrays, fence_output)
    write_marker(output, digest, marker, fence, report=report, settings=made_with)
    _gate(stage_name, report)  # after the marker: a changed threshold later needs no second run
    worker.note_committed()
    log.info("ran %s of %s", stage_name, vid)
    # Seconds inside the stage's own run (the model), apart from input loading and atomic writes;
    # added after the marker is written, so a marker stays the same whoever made it.
    return {**report, "run_s": ran_s}


def _gate(stage_name: str, report: dict[str, Any]) -> None:
    """Raise LowQuality when what the stages up to ``stage_name`` measured is below the settings' quality gates."""
    if stage_class(stage_name).writes != "hdf5":
        quality.enforce(report.get("quality"), settings().quality)


def _stamp(path: Path) -> tuple[int, int] | None:
    """A file's (modification time ns, size), or None when there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size

"""Whether a job is its run's own, from facts Redis cannot forge: the run's record and key in OUT/runs/.

``framefleet enqueue`` writes OUT/runs/<run_id>.json (naming the run, its RAW and its OUT) and the run's key
beside it (tasks.run.seal) before it sends anything. A worker takes a job (tasks.pipeline.gate, after the
schema and the roots) only when:

- that record exists in the job's output folder and names the job's run, output folder and input folder:
  a folder no enqueue made is no output folder, whatever a message says;
- the record says the run has not ended (a finished run's files are not made again by a message);
- the job carries the seal of the run's key over every field the enqueuer decides, and its video id is the
  one enqueue derives from the video's path.

The statistics callback is taken the same way (``callback``). Each worker reads a run's record and key once
(then a ``stat`` a job: a record rewritten, at the run's end, is read again). A worker with
``unrecorded_runs`` set (tests and tools that send jobs by hand; it says so at start) serves jobs of a
folder without any record too; a run with a record is checked as above wherever it is served.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import BadJobMessage
from tasks.job import Job
from tasks.run import runs, seal
from tasks.run.dataset import video_id_of
from tasks.workers import confinement
from worker_config.settings import Settings

log = logging.getLogger("framefleet.pipeline")
ENQUEUE = "framefleet enqueue RAW --out OUT"


class RunRefused(BadJobMessage):
    """A job of a real run that this worker cannot take as the run's (its key unreadable here, or a run of an
    earlier version without one): its video counts as failed in its run, which then ends naming the fix."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"job refused: {field}: {reason}")
        self.field, self.rule = field, reason


class NotTheRunsJob(RunRefused):
    """A job that no enqueue of its output folder made as it is: no record of its run there, a seal that does
    not match, or a run that has ended. Its video is not counted in any run (it names none truly)."""


@dataclass(frozen=True)
class RunFacts:
    """What OUT/runs/ says of one run: its folders, whether it has ended, and its key (None: none made)."""

    run_id: str
    output_root: str
    dataset_root: str
    ended: bool
    key: bytes | None
    stamp: tuple[int, int, int]  # the record file's (inode, size, mtime ns) when read


_READ: dict[tuple[str, str], RunFacts] = {}


def facts(output_root: str, run_id: str) -> RunFacts | None:
    """The record of ``run_id`` in ``output_root`` as this worker read it last (read again once it changed), or
    None when there is none. Raises RunRefused when its key cannot be read."""
    try:  # a string, not a Path: this runs for every job
        st = os.stat(f"{output_root}/{runs.FOLDER}/{run_id}.json")
    except OSError:
        _READ.pop((output_root, run_id), None)
        return None
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    known = _READ.get((output_root, run_id))
    if known is not None and known.stamp == stamp:
        return known
    out = Path(output_root)
    record = runs.read(out, run_id)
    if record is None:
        return None
    try:
        key = seal.read_key(out, run_id)
    except OSError as exc:
        raise RunRefused(
            "run_id",
            f"the key of run {run_id} ({seal.key_path(out, run_id)}) cannot be read by this worker ({exc.strerror}); "
            "start the workers as the user who enqueues, so they read OUT/runs/",
        ) from exc
    ended = record.get("status") == "finished" or "finished" in record
    found = RunFacts(
        str(record.get("run_id")),
        str(record.get("output_root")),
        str(record.get("raw_dir")),
        ended,
        key,
        stamp,
    )
    _READ[(output_root, run_id)] = found
    return found


def _recorded(output_root: str, run_id: str, conf: Settings) -> RunFacts | None:
    """The run's facts, or None for a folder without its record that this worker serves anyway
    (``unrecorded_runs``); raises NotTheRunsJob otherwise."""
    found = facts(output_root, run_id)
    if found is not None:
        if found.run_id != run_id or found.output_root != output_root:
            raise NotTheRunsJob(
                "output_root",
                f"{runs.path(Path(output_root), run_id)} names run {found.run_id!r} in {found.output_root!r}, not "
                f"this job's: not an output folder {ENQUEUE} made for this run",
            )
        if found.key is None:
            raise RunRefused(
                "run_id",
                f"run {run_id} has no key in {seal.key_path(Path(output_root), run_id).parent} (enqueued by an "
                f"earlier version): enqueue it again with `{ENQUEUE} --continue`",
            )
        return found
    if conf.unrecorded_runs:
        return None
    raise NotTheRunsJob(
        "output_root",
        f"no record of run {run_id} in {runs.path(Path(output_root), run_id)}: {output_root} is not an output "
        f"folder {ENQUEUE} made for this run (it writes that record before it sends anything)",
    )


def check(job: Job, conf: Settings) -> None:
    """Refuse ``job`` unless it is its run's own (module doc); raises NotTheRunsJob naming the field, or
    RunRefused for a real run's job this worker cannot check (no key, or one it cannot read)."""
    if not confinement.STATE["worker"]:
        return  # a program that runs a task's body itself: no message chose the job
    found = _recorded(job.output_root, job.run_id, conf)
    if found is None:
        return
    if found.dataset_root != job.dataset_root:
        raise NotTheRunsJob("dataset_root", f"run {job.run_id} reads {found.dataset_root!r}, not {job.dataset_root!r}")
    if found.ended:
        raise NotTheRunsJob(
            "run_id",
            f"its run {job.run_id} has ended (its record in {Path(job.output_root) / runs.FOLDER} says so): "
            "a finished run's files are not made again by a message",
        )
    if job.video_id != video_id_of(job.video):
        raise NotTheRunsJob("video_id", f"{job.video_id!r} is not the id of {job.video!r}")
    if not seal.matches(job.seal, seal.seal_of(found.key or b"", job)):
        raise NotTheRunsJob(
            "seal", f"does not match run {job.run_id}'s key: this job was not sent by the run's enqueue as it is"
        )


def callback(run: dict[str, Any], conf: Settings) -> bool:
    """Whether the statistics callback ``run`` (its run id and output root checked already) is to do its
    work: True for a run whose record says it is live, False for one that has ended (its files stand).
    Raises NotTheRunsJob for a folder without the run's record or a callback without the run's seal."""
    if not confinement.STATE["worker"]:
        return True
    run_id, output_root = str(run.get("run_id")), str(run.get("output_root"))
    found = _recorded(output_root, run_id, conf)
    if found is None:
        return True
    if not seal.matches(run.get("seal"), seal.callback_seal(found.key or b"", run_id, output_root)):
        raise NotTheRunsJob("seal", f"the statistics callback of run {run_id} does not carry the run's seal")
    return not found.ended


def callback_seal(run_id: str, output_root: str) -> str | None:
    """The seal the statistics callback of ``run_id`` carries; None when the run has no key (or no record)."""
    try:
        found = facts(output_root, run_id)
    except RunRefused:
        return None
    if found is None or found.key is None:
        return None
    return seal.callback_seal(found.key, run_id, output_root)

"""The dataset stage's partial statistics kept for the run's end: merged into the run's running sums in
Redis (tasks.statistics.sums) and appended to this process's segment in OUT/markers/ (tasks.statistics.partials)."""

from __future__ import annotations

import logging
from pathlib import Path

from tasks.celery_app import settings
from tasks.outputs.stage_io import output_path
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.redis_client import get_redis
from tasks.run import runs
from tasks.stages import stage_class
from tasks.statistics import partials, sums

log = logging.getLogger("framefleet.pipeline")


class KeepPartials(StageHook):
    """Keep a finished video's partial statistics; without them the run's end reads its marker.

    It runs after the marker is written, also when the stage found its output made (a redelivery):
    the merge is idempotent per video (tasks.statistics.sums), and a merge lost to a crash or a Redis error
    leaves the sums short of OUT's markers, which sends the run's end to the full pass.
    """

    def __init__(self) -> None:
        self._shards: dict[str, int] = {}  # run id -> its merged-marks shards (from the run's size)

    def after_success(self, call: StageCall) -> None:
        if "stats" not in call.report or stage_class(call.stage_name).writes != "hdf5":
            return
        conf = settings()
        job = call.job
        out_root = Path(job.output_root)
        try:
            entry = partials.entry_of(output_path(out_root, job.video_id, call.stage_name), call.report["stats"])
        except Exception as exc:
            log.warning("partial statistics of %s not kept: %s", job.video_id, exc)
            return
        try:
            partials.append(out_root, job.video_id, entry)
        except OSError as exc:
            log.warning(
                "partial statistics of %s not appended to its segment (%s): its marker is read", job.video_id, exc
            )
        try:
            r = get_redis(conf.redis_url)
            merged = sums.merge(
                r, job.run_id, self._shard_count(r, job.run_id), job.video_id, entry, conf.result_expires_s
            )
        except Exception as exc:
            log.warning("partial statistics of %s not merged in run %s: %s", job.video_id, job.run_id, exc)
            return
        if merged == 2:
            log.warning(
                "run %s: %s was merged before with another file; its end pools every video", job.run_id, job.video_id
            )

    def _shard_count(self, r: object, run_id: str) -> int:
        if run_id not in self._shards:
            record = runs.lookup(r, run_id)
            if len(self._shards) > 64:
                self._shards.clear()
            # Without its record (an expired run): one shard per run, correct at any size, larger past 128 videos.
            self._shards[run_id] = sums.shards_of(record)
        return self._shards[run_id]

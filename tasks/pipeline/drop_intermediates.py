"""``--intermediates drop``: a video's OUT/work/ folder deleted once its dataset file is written."""

from __future__ import annotations

import logging
from pathlib import Path

from tasks.errors import PathOutsideRoot
from tasks.outputs import intermediates
from tasks.pipeline.hooks import StageCall, StageHook
from tasks.stages import stage_class

log = logging.getLogger("framefleet.pipeline")


class DropIntermediates(StageHook):
    """Delete a finished video's intermediates when its run asked for it; a failure is only logged."""

    def after_success(self, call: StageCall) -> None:
        job = call.job
        if stage_class(call.stage_name).writes != "hdf5" or job.intermediates != "drop":
            return
        try:
            freed = intermediates.drop(Path(job.output_root), job.video_id)
            log.info("dropped the intermediates of %s (%d bytes)", job.video_id, freed)
        except (OSError, PathOutsideRoot) as exc:  # the dataset file is complete; leftovers are for `framefleet clean`
            log.warning("intermediates of %s not dropped: %s", job.video_id, exc)

"""The stage task: one Celery task per stage, a short body, and each concern around it as a hook.

``task.HOOKS`` lists the concerns (claim, attempts, cancellation, OOM, retries, partials,
intermediates, progress, metrics, the video's end) in the order they run; ``hooks`` names the moments.
"""

from tasks.pipeline.execute import chain_of
from tasks.pipeline.task import HOOKS, STAGE_TASKS, run_stage

__all__ = ["HOOKS", "STAGE_TASKS", "chain_of", "run_stage"]

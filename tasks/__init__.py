"""framefleet's Celery package: ``celery -A tasks worker -Q gpu0`` starts the worker of GPU 0."""

import importlib
from types import ModuleType

from tasks.celery_app import app, configure, settings
from tasks.observe import flower_guard, inspect_gpu  # noqa: F401  (Flower's auth check; `inspect gpu`)
from tasks.pipeline import task  # noqa: F401  (the stage tasks)
from tasks.run import aggregate  # noqa: F401  (the statistics callback)
from tasks.workers import worker  # noqa: F401  (the worker's start-up signals)

__all__ = ["app", "configure", "settings"]

# Modules that sat directly in tasks/ before it was grouped by concern: `from tasks import transport`
# (scripts written against earlier versions) still finds them in their new package.
_GROUPS = {
    "run": "dataset completion aggregate stats runs cancel metadata report quarantine partials",
    "delivery": "transport publish queues routing rebalance leases claims requeues",
    "workers": "worker heartbeat registry",
    "outputs": "storage stage_io intermediates windows geometry",
    "observe": "metrics progress flower_view flower_guard inspect_gpu stall",
    "pipeline": "oom",
}
_MOVED = {name: f"tasks.{group}.{name}" for group, names in _GROUPS.items() for name in names.split()}


def __getattr__(name: str) -> ModuleType:
    if name in _MOVED:
        return importlib.import_module(_MOVED[name])
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")

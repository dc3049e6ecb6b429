"""framefleet's Celery package: ``celery -A tasks worker -Q gpu0`` starts the worker of GPU 0."""

from tasks.celery_app import app, configure, settings
from tasks.moved import __getattr__  # noqa: F401  (`from tasks import transport`: a module that moved)
from tasks.observe import flower_guard, inspect_gpu  # noqa: F401  (Flower's auth check; `inspect gpu`)
from tasks.pipeline import task  # noqa: F401  (the stage tasks)
from tasks.run import aggregate  # noqa: F401  (the statistics callback)
from tasks.workers import worker  # noqa: F401  (the worker's start-up signals)

__all__ = ["app", "configure", "settings"]

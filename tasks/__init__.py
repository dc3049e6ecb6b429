"""framefleet's Celery package: ``celery -A tasks worker -Q gpu0`` starts the worker of GPU 0."""

from tasks import flower_guard, inspect_gpu, pipeline, worker  # noqa: F401  (Flower's auth check, then tasks, signals, `inspect gpu`)
from tasks.celery_app import app, configure, settings

__all__ = ["app", "configure", "settings"]

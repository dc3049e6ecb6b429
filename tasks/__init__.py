"""framefleet's Celery package: ``celery -A tasks worker -Q gpu0`` starts the worker of GPU 0."""

from tasks import pipeline  # noqa: F401
from tasks.celery_app import app, configure, settings
from tasks.observe import flower_guard, inspect_gpu  # noqa: F401
from tasks.workers import worker  # noqa: F401

__all__ = ["app", "configure", "settings"]

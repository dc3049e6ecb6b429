"""framefleet's Celery package: ``celery -A tasks worker -Q gpu0`` starts the worker of GPU 0."""

from tasks import pipeline, worker  # noqa: E402,F401  (registers tasks and signal handlers)
from tasks.celery_app import app, configure, settings

__all__ = ["app", "configure", "settings"]

"""framefleet's Celery package: ``celery -A tasks worker -Q gpu0`` starts the worker of GPU 0.

Importing the package, or a module of it, loads neither Celery nor the settings: the first use of
``tasks.app`` (what ``celery -A tasks`` asks for), ``configure`` or ``settings`` loads the app with
everything it registers, so that a command that only reads Redis (``framefleet status``) starts quickly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tasks.moved import moved_module

if TYPE_CHECKING:
    from tasks.celery_app import app, configure, settings

__all__ = ["app", "configure", "settings"]

# What the app registers, loaded with it: the stage tasks, the statistics callback, the worker's start-up
# signals and `inspect gpu` (Flower's auth check is the app module's own: tasks.celery_app).
REGISTERED = (
    "tasks.pipeline.task",
    "tasks.run.aggregate",
    "tasks.workers.worker",
    "tasks.observe.inspect_gpu",
)


def __getattr__(name: str) -> Any:
    if name in __all__:
        celery_app = importlib.import_module("tasks.celery_app")
        for module in REGISTERED:
            importlib.import_module(module)
        return getattr(celery_app, name)
    return moved_module(name)  # `from tasks import transport`: a module that moved

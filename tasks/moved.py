"""Modules that sat directly in tasks/ before it was grouped by concern, found in their new package.

``from tasks import transport`` (scripts written against earlier versions) still works: the package's
``__getattr__`` (PEP 562) asks ``moved_module``.
"""

import importlib
from types import ModuleType

_GROUPS = {
    "run": "dataset completion aggregate stats runs cancel metadata report quarantine partials",
    "delivery": "transport publish queues routing rebalance leases claims requeues",
    "workers": "worker heartbeat registry",
    "outputs": "storage stage_io intermediates windows geometry",
    "observe": "metrics progress flower_view flower_guard inspect_gpu stall",
    "pipeline": "oom",
}
_MOVED = {name: f"tasks.{group}.{name}" for group, names in _GROUPS.items() for name in names.split()}


def moved_module(name: str) -> ModuleType:
    """The module ``name`` moved to; raises AttributeError, as a missing attribute of ``tasks`` does."""
    if name in _MOVED:
        return importlib.import_module(_MOVED[name])
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")

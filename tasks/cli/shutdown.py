"""A cluster's shutdown that signals hurry and never abort: every process it started ends, Redis included."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType, TracebackType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Hurry:
    """While in effect, Ctrl-C, SIGTERM and SIGHUP set a flag (call the object to read it) instead of raising:
    the shutdown that reads it stops waiting for the workers' tasks and kills them, but goes on to the end.

    Outside the main thread (where signal handlers cannot be set) it only holds the flag.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.previous: dict[int, object] = {}

    def __call__(self) -> bool:
        return self.event.is_set()

    def __enter__(self) -> Hurry:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self.event.is_set():
            print(
                f"\n{signal.Signals(signum).name} while stopping: not waiting for the workers' tasks any more; "
                "every process of this cluster is still stopped, Redis last",
                file=sys.stderr,
                flush=True,
            )
        self.event.set()

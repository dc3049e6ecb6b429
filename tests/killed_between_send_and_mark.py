"""A fault point: the worker that sends a held (pending) video dies between the send and the mark that it was sent.

Loaded into a worker with ``celery -A tasks worker -I tests.killed_between_send_and_mark``. It dies by SIGKILL
before the second of the two steps of tasks.run.completion.send_pending, whichever comes first in the code,
the first time that function runs in the process: what a host lost there leaves behind.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from tasks.run import completion, pending

_taken: list[str] = []  # the steps of the send this process has taken


def _step(name: str) -> None:
    if _taken:
        print(f"fault point: killed before the {name}, after the {_taken[0]}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    _taken.append(name)


class _Sending:
    """A video's chain whose send is a step of the fault point."""

    def __init__(self, chain: Any) -> None:
        self.chain = chain

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        _step("send")
        return self.chain.apply_async(*args, **kwargs)


_mark_sent, _video_chain = pending.mark_sent, completion.video_chain


def mark_sent(*args: Any, **kwargs: Any) -> Any:
    _step("mark")
    return _mark_sent(*args, **kwargs)


def video_chain(job: Any) -> _Sending:
    return _Sending(_video_chain(job))


pending.mark_sent = mark_sent
completion.video_chain = video_chain  # type: ignore[assignment]

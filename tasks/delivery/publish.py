"""Sending a task again when kombu failed the send on a channel its own reconnect had closed."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def closed_channel(exc: BaseException) -> bool:
    """True when ``exc`` is kombu's transport using a closed channel, whose connection closing set to None."""
    frames = traceback.extract_tb(exc.__traceback__)
    return (
        isinstance(exc, AttributeError)
        and str(exc).startswith("'NoneType' object has no attribute")
        and bool(frames)
        and "/kombu/transport/" in frames[-1].filename.replace("\\", "/")
    )


def send_once_more_on_closed_channel(send: Callable[[], T], producer: Any) -> T:
    """Call ``send`` (a publish of a task); call it again if kombu failed it on a closed channel.

    Celery declares the target queue on every send (celery/app/amqp.py:593-594) and kombu's
    ``Producer._publish`` takes its channel before that declaration (kombu/messaging.py:362-368).
    When Redis is away, the declaration retries on its own (kombu/common.py:176-177): its reconnect
    closes the channel ``_publish`` holds, and the publish then fails with AttributeError ("'NoneType'
    object has no attribute 'state'", kombu/transport/virtual/base.py:842, or "... 'client'",
    kombu/transport/redis.py:1957) instead of a connection error its retry policy would handle.
    Nothing was sent then, and a pooled producer gets a channel of the reconnected connection when
    acquired again (kombu/pools.py, ``ProducerPool.prepare``), so the second send goes through. A
    caller's own ``producer`` is left to the caller.
    """
    try:
        return send()
    except AttributeError as exc:
        if producer is not None or not closed_channel(exc):
            raise
        log.warning("sending a task again: kombu's reconnect closed the channel of the first send (%s)", exc)
        return send()

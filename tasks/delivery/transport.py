"""kombu's Redis transport, with an ack that Redis refuses still freeing the worker's prefetch slot.

kombu's Redis ``QoS.ack`` removes the message from the ``unacked`` hash first and forgets the
delivery tag only after that (kombu/transport/redis.py:499-501, ``QoS.ack``). When Redis is away
at that moment the removal raises, Celery only logs it ("Couldn't ack ..."), and the tag stays
delivered: with a prefetch of 1 ``can_consume()`` is False for good
(kombu/transport/virtual/base.py:197-204), so a solo worker never takes another message, and
while it waits for nothing the poller skips even the pub/sub socket that would tell it the
broker went away. The worker looks alive and does nothing.

Here the removal is tried a few times over a few seconds (a restarting Redis is usually back
by then) and the tag is forgotten either way. A message whose removal never reached Redis stays
in ``unacked`` and comes back, after the reaper or the visibility timeout requeues it, as a
duplicate delivery of a finished stage: the stage's done marker and claim turn it away
(tasks.delivery.claims), so nothing runs twice.

``install()`` (called when tasks.celery_app is imported) makes ``redis://`` brokers use it in
this process, through kombu's own table of transport aliases, so that URLs, Flower's broker view
and the worker banner still read ``redis://``; other schemes keep kombu's transports.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

log = logging.getLogger(__name__)

# Seconds to wait before each further try of the removal; about 3.5 s in all.
RETRY_DELAYS_S = (0.5, 1.0, 2.0)


class QoS(kombu_redis.QoS):  # type: ignore[misc]
    """kombu's Redis QoS whose ack and reject always forget the delivery tag locally."""

    def ack(self, delivery_tag: Any) -> None:
        self._try("ack", delivery_tag, lambda: self._remove_from_indices(delivery_tag).execute())
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if requeue:
            self._try("requeue", delivery_tag, lambda: self.restore_by_tag(delivery_tag, leftmost=True))
        else:
            self._try("reject", delivery_tag, lambda: self._remove_from_indices(delivery_tag).execute())
        virtual.QoS.ack(self, delivery_tag)

    def _try(self, what: str, delivery_tag: Any, call: Any) -> None:
        for delay in (*RETRY_DELAYS_S, None):
            try:
                call()
                return
            except Exception as exc:  # redis-py's errors, and kombu's wrapping of them
                if delay is None:
                    log.warning(
                        "%s of message %s did not reach Redis (%s): the message stays in unacked and "
                        "comes back as a duplicate, which its stage's done marker turns away; "
                        "this worker goes on consuming",
                        what,
                        delivery_tag,
                        exc,
                    )
                    return
                time.sleep(delay)


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    QoS = QoS


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


def install() -> None:
    """Make ``redis://`` broker URLs resolve to this module's Transport in this process."""
    from kombu import transport as kombu_transport

    kombu_transport.TRANSPORT_ALIASES["redis"] = f"{__name__}:Transport"
    kombu_transport._transport_cache.pop("redis", None)  # resolved before this call: resolve it again

"""kombu's Redis transport, with a delivery that cannot drop a message, sends that a restart cannot
misroute, an ack that Redis refuses still freeing the worker's prefetch slot, and an event loop
that a quick restart cannot stall.

**Delivery.** kombu takes a message with BRPOP and only afterwards registers it in ``unacked``
(``QoS.append``: ZADD + HSET, kombu/transport/redis.py ``_brpop_read`` → virtual ``_deliver``);
between the two the message exists only in the worker's memory, and a Redis that goes away then
loses it. Here a worker BRPOPs its queues' doorbells (``ff:bell:<queue>``), never the queues;
then one Lua script (``POP``) takes the first message of the first non-empty priority list and
writes its ``unacked``/``unacked_index`` entries, atomically, in Redis: a message is always in a
queue or in ``unacked`` (from where the visibility timeout and the reaper, tasks.delivery.leases, put it
back). Publishers ring the doorbell in the same MULTI as the LPUSH; a lost ring only delays a
message to the next poll (BRPOP times out every ``brpop_timeout``, 1 s, and the script runs then
too). Queues, priorities and the ``unacked`` entries are kombu's own, so Flower, ``celery
inspect``, ``framefleet status`` and restores read them as before.

**Sends.** kombu routes a send or a restore to a named exchange through its binding set
``_kombu.binding.<exchange>``, which a Redis restarted without its data no longer has: the message
went nowhere, without an error (``get_table`` returns ``[]``). A direct exchange named after its
routing key (Celery's per-queue exchange) with no binding delivers to the queue of that name.

**Acks.** kombu's ``QoS.ack`` removes the message from ``unacked`` first and forgets the tag only
after that (kombu/transport/redis.py ``QoS.ack``): a Redis away then left the prefetch slot taken
for good. Here the removal is tried a few times and the tag is forgotten either way; a message
whose removal never reached Redis comes back as a duplicate, which its stage's done marker and
claim turn away (tasks.delivery.claims).

**The event loop's connections.** The BRPOP connection and the pub/sub one (Celery's remote
control, a fanout queue) make no redis-py retry: a read or send that fails raises to kombu, and
through it to Celery's consumer, which restarts (reconnecting and subscribing again). redis-py's
retry of a failed pub/sub read reconnects and reads again, expecting its connect callback to have
subscribed the new connection, but kombu hands the PubSub its connection itself
(``MultiChannelPoller._client_registered``), so no callback is registered: the retry read, blocking
and without a timeout, waited forever on a connection subscribed to nothing. A worker whose loop
met the closed socket only once Redis was back (a quick restart, the loop busy meanwhile) stopped
there, logging nothing and taking no task again.

``install()`` (called when tasks.celery_app is imported) makes every Redis broker URL use it in this
process (``redis://``, ``rediss://`` with its ``ssl_*`` options, ``redis+socket://`` and, with kombu's
Sentinel pool under the same channel, ``sentinel://``), through kombu's own table of transport aliases,
so that URLs, Flower's broker view and the worker banner still read as given. Pinned to
kombu 5.7.0 (pyproject); tests/test_transport.py fails when the kombu code it replaces changes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks import keys

log = logging.getLogger(__name__)

# Seconds to wait before each further try of the removal; about 3.5 s in all.
RETRY_DELAYS_S = (0.5, 1.0, 2.0)
BELL_PREFIX = keys.BELL_PREFIX
BELL_MAX = 100  # rings kept per doorbell: more only wake a worker to find nothing

# KEYS: unacked, unacked_index, then the lists to take from, in order; ARGV: the delivery time (unix s),
# then per list '1' when its consumer acks (its message is registered) or '0' (no_ack consumers).
# Returns {list, message} or nil. The unacked entry is kombu's own: [message, exchange, routing key].
# A message it cannot read is handed over unregistered, as kombu's BRPOP would (a script error after
# the RPOP would drop it: Redis keeps a script's writes up to its error).
POP = """
for i = 3, #KEYS do
  local item = redis.call('RPOP', KEYS[i])
  if item then
    if ARGV[i - 1] == '0' then return {KEYS[i], item} end
    local ok, entry = pcall(function()
      local p = cjson.decode(item)['properties']
      local info = p['delivery_info']
      return {p['delivery_tag'],
        '[' .. item .. ', ' .. cjson.encode(info['exchange']) .. ', ' .. cjson.encode(info['routing_key']) .. ']'}
    end)
    if ok and type(entry[1]) == 'string' then
      redis.call('ZADD', KEYS[2], ARGV[1], entry[1])
      redis.call('HSET', KEYS[1], entry[1], entry[2])
    end
    return {KEYS[i], item}
  end
end
return false
"""


def bell_key(queue: str) -> str:
    """The doorbell list of ``queue``: one entry per message sent to it (at most BELL_MAX)."""
    return BELL_PREFIX + queue


def ring(pipe: Any, queue: str) -> None:
    """Add to ``pipe`` the commands that wake a worker consuming ``queue``."""
    pipe.lpush(bell_key(queue), 1)
    pipe.ltrim(bell_key(queue), 0, BELL_MAX - 1)


class QoS(kombu_redis.QoS):  # type: ignore[misc]
    """kombu's Redis QoS: entries written by the pop script are not written again; ack and reject
    always forget the delivery tag locally."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        if self.channel.registered == delivery_tag:  # POP wrote its unacked entry with the pop
            self.channel.registered = None
            virtual.QoS.append(self, message, delivery_tag)
        else:
            super().append(message, delivery_tag)

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
    """kombu's Redis channel taking messages with the atomic pop, and ringing doorbells as it sends."""

    QoS = QoS
    registered: Any = None  # the delivery tag whose unacked entry POP has just written

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._pop_order: list[str] = []
        self.no_ack_queues: set[str] = set()  # consumed without acks (Celery's control replies)
        super().__init__(*args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)
        if asynchronous:  # the event loop's connections: an error reaches kombu, never a retry on a new connection
            params["retry"] = Retry(NoBackoff(), 0)
        return params

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        # A consumer that does not ack must not leave its messages in unacked.
        (self.no_ack_queues.add if no_ack else self.no_ack_queues.discard)(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def _brpop_start(self, timeout: float | None = None) -> None:
        if self.global_keyprefix:
            return super()._brpop_start(timeout)  # not supported here: kombu's own (non-atomic) delivery
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        # The order kombu's BRPOP takes them in: every queue's priority 0, then every queue's 1, ...
        self._pop_order = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]  # kombu declares it None
        self.client.connection.send_command("BRPOP", *[bell_key(q) for q in queues], timeout or 0)

    def _brpop_read(self, **options: Any) -> bool:
        if self.global_keyprefix:
            return bool(super()._brpop_read(**options))
        try:
            try:
                self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next poll reconnects
                raise
        finally:
            self._in_poll = None  # type: ignore[assignment]  # kombu's own reset (it declares False)
            self._flush_brpop_reauth()
        if self._closing:  # a channel closing takes nothing more; the ring alone is spent
            raise virtual.Empty()
        popped = self._pop(self._pop_order)
        if popped is None:
            raise virtual.Empty()
        dest, raw = popped
        self._queue_cycle.rotate(dest)
        self._deliver_registered(raw, dest)
        return True

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        if self.global_keyprefix:
            return super().basic_get(queue, no_ack, **kwargs)
        popped = self._pop([self._q_for_pri(queue, pri) for pri in self.priority_steps], acks=not no_ack)
        if popped is None:
            return None
        message = self.Message(popped[1], channel=self)
        if not no_ack:
            self.registered = message.delivery_tag
            self.qos.append(message, message.delivery_tag)
        return message

    def _pop(self, lists: list[str], acks: bool | None = None) -> tuple[str, Any] | None:
        """Take the first message of the first non-empty list of ``lists``, and (when its consumer acks)
        write it into ``unacked``, in one step; return (queue, message) or None."""
        if not lists:
            return None
        flags = [
            "1" if acks or (acks is None and self._queue_of(key) not in self.no_ack_queues) else "0" for key in lists
        ]
        with self.conn_or_acquire() as client:
            popped = client.eval(
                POP, 2 + len(lists), self.unacked_key, self.unacked_index_key, *lists, time.time(), *flags
            )
        if not popped:
            return None
        dest, item = popped
        return self._queue_of(bytes_to_str(dest)), loads(bytes_to_str(item))

    def _queue_of(self, key: str) -> str:
        return str(key.rsplit(self.sep, 1)[0])

    def _deliver_registered(self, message: Any, queue: str) -> None:
        if queue not in self.no_ack_queues:
            self.registered = message["properties"]["delivery_tag"]
        try:
            self.connection._deliver(message, queue)
        finally:
            self.registered = None

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        """Deliver message: LPUSH it and ring its queue's doorbell, in one MULTI."""
        if self.global_keyprefix:
            return super()._put(queue, message, **kwargs)  # type: ignore[no-any-return]
        batch = kwargs.pop("_publish_batch", None)
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        expires = self._expires.get(queue) if self._expires else None
        if batch is not None:
            batch.add("lpush", key, dumps(message))
            batch.add("lpush", bell_key(queue), 1)
            batch.add("ltrim", bell_key(queue), 0, BELL_MAX - 1)
            for p in self.priority_steps if expires else ():
                batch.add("pexpire", self._q_for_pri(queue, p), expires)
            return None
        with self.conn_or_acquire() as client, client.pipeline() as pipe:
            pipe.lpush(key, dumps(message))
            ring(pipe, queue)
            for p in self.priority_steps if expires else ():
                pipe.pexpire(self._q_for_pri(queue, p), expires)
            pipe.execute()
        return None

    def _do_restore_message(
        self, payload: Any, exchange: str, routing_key: str, pipe: Any, leftmost: bool = False
    ) -> None:
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        try:
            for queue in self._lookup(exchange, routing_key):
                ring(pipe, queue)
        except Exception as exc:  # the message is back on its list; the next poll finds it
            log.warning("restored message not rung for (%s): %s", routing_key, exc)

    def _lookup(self, exchange: str, routing_key: str, default: Any = None) -> list[str]:
        # Celery's exchange of a queue is a direct exchange named after it and bound with its name as
        # the key: without its binding set (Redis restarted empty) that queue is still the destination.
        if exchange and exchange == routing_key and self.typeof(exchange).type == "direct":
            try:
                table = self.get_table(exchange)
            except KeyError:
                table = []
            if not table:
                return [routing_key]
        return list(super()._lookup(exchange, routing_key, default))


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):  # type: ignore[misc]
    """The channel above on the primary the Sentinels name: kombu's SentinelChannel supplies only the pool."""


class SentinelTransport(kombu_redis.SentinelTransport):  # type: ignore[misc]
    Channel = SentinelChannel


# kombu's alias of each Redis scheme (redis+socket:// is the redis alias with a socket:// host) and its transport here.
ALIASES = {"redis": "Transport", "rediss": "Transport", "sentinel": "SentinelTransport"}


def install() -> None:
    """Make every Redis broker URL (redis://, rediss://, redis+socket://, sentinel://) resolve to this module's
    transports in this process."""
    from kombu import transport as kombu_transport

    for alias, name in ALIASES.items():
        kombu_transport.TRANSPORT_ALIASES[alias] = f"{__name__}:{name}"
        kombu_transport._transport_cache.pop(alias, None)  # resolved before this call: resolve it again

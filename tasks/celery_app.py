"""The Celery app, configured for long GPU tasks on Redis; importing it touches no GPU."""

from __future__ import annotations

import socket

import click
from celery import Celery

from tasks import redis_urls
from tasks.delivery import queues, transport
from tasks.observe import flower_guard
from worker_config.settings import ConfigError, Settings, exit_on_config_error, load_settings

TASK_PREFIX = "framefleet."
# TCP keepalive on the broker's connections: a peer silent for 10 s is probed every 5 s and given up
# after 3 unanswered probes, so a half-open connection fails within about 25 s.
KEEPALIVE = {socket.TCP_KEEPIDLE: 10, socket.TCP_KEEPINTVL: 5, socket.TCP_KEEPCNT: 3}

# Every Redis scheme: kombu's transport with the one-step pop-and-record and the ack retries (tasks.delivery.transport).
transport.install()


class App(Celery):
    """The Celery app whose worker program applies framefleet's worker design (tasks.workers.launch)."""

    @property
    def Worker(self) -> type:  # noqa: N802  (Celery's name)
        return self.subclass_with_self("tasks.workers.launch:Worker")  # type: ignore[no-any-return]


app = App("framefleet")
# `celery -A tasks worker --unconfined`: a worker that reads and writes wherever a message says
# (tasks.workers.confinement); an explicit choice, said loudly at start and on every job.
app.user_options["worker"].add(
    click.Option(
        ["--unconfined"],
        is_flag=True,
        default=False,
        help="framefleet: serve jobs whatever roots they name (default: confined; see docs/security.md)",
    )
)
_settings: Settings | None = None


def settings() -> Settings:
    """Return the settings this process runs with (loaded from the environment on first use)."""
    global _settings
    if _settings is None:
        try:
            configure(load_settings())
        except ConfigError as exc:
            exit_on_config_error(exc)
    assert _settings is not None
    return _settings


def configure(new: Settings) -> Celery:
    """Apply ``new`` to the Celery app; scripts call this after parsing --config."""
    global _settings
    _settings = new
    transport = {
        "visibility_timeout": new.visibility_timeout_s,
        "socket_keepalive": True,
        "socket_keepalive_options": KEEPALIVE,
        "retry_on_timeout": True,
        # No redis-py health check on the broker's connections: when one finds the BRPOP connection
        # dead (a long task ran across a Redis restart), redis-py reconnects inside kombu's
        # _brpop_start and sends the BRPOP on a socket kombu neither polls nor counts as waiting
        # for a reply (the disconnect clears Channel._in_poll: kombu/transport/redis.py:1257-1260,
        # 1467-1474; redis/connection.py:1329-1344); the consumer's restart then closes that socket
        # with the popped message unread, and the message is gone. TCP keepalive finds dead peers.
        "health_check_interval": 0,
        # A list per priority, so that a video's later stages overtake earlier ones (tasks.delivery.queues).
        **queues.transport_options(),
    }
    broker_url, broker_options = redis_urls.for_celery(new.broker)
    results_url, results_options = redis_urls.for_celery(new.results)
    if (app.conf.get("result_backend"), app.conf.get("broker_url")) not in ((None, None), (results_url, broker_url)):
        # Another Redis (or another kind: a Sentinel's): the backend and the producers made for the old one go,
        # else they would keep talking to it (Celery builds each once, on first use, and keeps it).
        app._backend_cache = None
        app._local.__dict__.pop("backend", None)
        app._after_fork()
    app.conf.update(
        broker_url=broker_url,
        result_backend=results_url,
        broker_transport_options={**transport, **broker_options},
        # rediss://'s ssl_* options as a setting too: Flower's broker view reads only this one.
        broker_use_ssl=redis_urls.ssl_options(new.broker) or False,
        result_backend_transport_options={"retry_policy": {"timeout": 5.0}, **results_options},
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # A task that ends while Redis is away waits for it (about 5 minutes at most) to send its
        # next stage and store its result, instead of failing, which would break the run's chord.
        task_publish_retry_policy={"max_retries": 150, "interval_start": 0, "interval_step": 0.5, "interval_max": 2},
        result_backend_always_retry=True,
        result_backend_max_retries=150,
        result_backend_max_sleep_between_retries_ms=2000,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        event_serializer="json",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_track_started=True,
        task_send_sent_event=True,
        worker_send_task_events=True,
        result_expires=new.result_expires_s,
        result_extended=True,
        task_default_queue=new.cpu_queue,
        task_routes=("tasks.delivery.routing.route_task",),
        worker_hijack_root_logger=True,
        worker_redirect_stdouts_level="INFO",
        worker_max_tasks_per_child=new.max_tasks_per_worker or None,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_time_limit=None,
    )
    return app


# Flower names the app as its user writes -A (tasks, tasks.celery_app:app, a module of theirs importing it):
# wherever the app is built, Flower's lock is set before it serves.
flower_guard.guard()
settings()

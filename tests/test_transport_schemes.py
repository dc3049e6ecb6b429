"""Every Redis URL scheme goes through framefleet's transport and client: the kombu alias of each, the app each
program configures from its URL, and a real worker's Redis commands on a real server of each kind (TCP, TLS, a
Unix socket, a primary behind three Sentinels), where a delivery must pop and record in one script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from kombu import transport as kombu_transport

import tasks.celery_app
from tasks import app, redis_urls
from tasks.delivery import transport
from tasks.redis_client import connect, free_port, server_argv
from tests.conftest import ROOT, wait_until
from tests.redis_servers import SentinelGroup, certificates
from tests.test_flower_monitoring import Flower

pytestmark = pytest.mark.timeout(180)

SENTINEL_URL = "sentinel://:pw@127.0.0.1:26379;sentinel://127.0.0.1:26380;sentinel://127.0.0.1:26381/2?master_name=m1"
URLS = {
    "redis": "redis://127.0.0.1:6379/0",
    "rediss": "rediss://:pw@127.0.0.1:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ssl/ca.crt",
    "redis+socket": "redis+socket:///run/redis/redis.sock?virtual_host=3",
    "unix": "unix:///run/redis/redis.sock?db=3",
    "sentinel": SENTINEL_URL,
}


def test_every_kombu_alias_of_the_redis_transport_names_framefleets():
    aliases = kombu_transport.TRANSPORT_ALIASES
    redis_ones = {a: t for a, t in aliases.items() if str(t).startswith(("kombu.transport.redis", transport.__name__))}
    assert {"redis", "rediss", "sentinel"} <= set(redis_ones)
    resolved = {alias: kombu_transport.resolve_transport(alias) for alias in redis_ones}
    assert {a: c for a, c in resolved.items() if not issubclass(c.Channel, transport.Channel)} == {}


@pytest.mark.parametrize("scheme", list(URLS))
def test_each_scheme_configures_the_broker_results_and_client_of_every_program(scheme, monkeypatch):
    url = URLS[scheme]
    before = tasks.celery_app.settings()
    monkeypatch.setenv("REDIS_URL", url)
    try:
        tasks.celery_app.configure(tasks.celery_app.load_settings())
        conn = app.connection_for_write()
        assert issubclass(conn.transport.Channel, transport.Channel), f"{scheme}: {conn.transport}"
        options = app.conf.broker_transport_options
        if scheme == "sentinel":
            assert options["master_name"] == "m1" and app.conf.result_backend_transport_options["master_name"] == "m1"
            assert conn.transport.Channel is transport.SentinelChannel
            assert conn.alt == [f"sentinel://:pw@127.0.0.1:{p}/2" for p in (26379, 26380, 26381)]
            assert type(app.backend).__name__ == "SentinelBackend"
        else:
            assert "master_name" not in options
        assert "master_name" not in str(app.conf.broker_url) and "master_name" not in str(app.conf.result_backend)
    finally:
        tasks.celery_app.configure(before)


def test_a_sentinel_url_needs_its_master_name_and_hides_every_password():
    with pytest.raises(redis_urls.RedisURLError, match="master_name=NAME"):
        redis_urls.check("sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380")
    with pytest.raises(redis_urls.RedisURLError, match="scheme 'http'"):
        redis_urls.check("http://127.0.0.1:6379")
    found = redis_urls.sentinels(SENTINEL_URL)
    assert found.hosts == (("127.0.0.1", 26379), ("127.0.0.1", 26380), ("127.0.0.1", 26381))
    assert (found.master_name, found.db, found.password) == ("m1", 2, "pw")
    celery_url, options = redis_urls.for_celery(SENTINEL_URL)
    assert celery_url.split(";") == [f"sentinel://:pw@127.0.0.1:{p}/2" for p in (26379, 26380, 26381)]
    assert options == {"master_name": "m1"}
    two = "sentinel://:s3cret@a:1/0;sentinel://:s3cret@b:2/0?master_name=m"
    assert "s3cret" not in redis_urls.redact(two) and redis_urls.redact(two).count("***") == 2
    odd = redis_urls.for_celery("sentinel://:p%40ss%2Fw@a:1/0?master_name=m")[0]
    assert odd == "sentinel://:p%40ss%2Fw@a:1/0" and redis_urls.sentinels(odd + "?master_name=m").password == "p@ss/w"
    assert redis_urls.for_celery(URLS["unix"])[0] == URLS["redis+socket"]
    assert redis_urls.for_redis_py(URLS["redis+socket"]) == URLS["unix"]


class Monitor:
    """Every command a Redis server runs from now on, as MONITOR reports it (a script's own commands tagged lua)."""

    def __init__(self, client: redis.Redis) -> None:
        self.commands: list[dict] = []
        self.ended: Exception | None = None
        self._monitor = client.monitor()
        self._monitor.__enter__()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                self.commands.append(self._monitor.next_command())
        except (redis.RedisError, OSError, ValueError) as exc:
            self.ended = exc  # the server stopped (the test is over), or MONITOR failed: the test says so


def _short_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="ff-"))  # a Unix socket's path must stay under about 100 characters


@pytest.fixture(params=["redis", "rediss", "redis+socket", "sentinel"])
def server(request, tmp_path) -> Iterator[tuple[str, redis.Redis]]:
    """A real Redis reached by one scheme: the URL framefleet's programs are given, and a client of its primary
    with a socket timeout longer than the test (for MONITOR)."""
    folder = _short_folder()
    procs: list[subprocess.Popen[bytes]] = []
    group = None
    try:
        if request.param == "sentinel":
            group = SentinelGroup(folder)
            group.start()
            url = group.url
            client = redis.Redis(port=group.primary_port() or 0, decode_responses=True, socket_timeout=300)
        else:
            port = free_port()
            argv = server_argv(port, folder)
            if request.param == "rediss":
                certificates(folder)
                argv[2] = "0"  # TLS only: the port is the TLS one
                argv += ["--tls-port", str(port)]
                argv += ["--tls-cert-file", "server.crt", "--tls-key-file", "server.key"]
                argv += ["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"]
                url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={folder / 'ca.crt'}"
            elif request.param == "redis+socket":
                argv += ["--unixsocket", str(folder / "redis.sock"), "--unixsocketperm", "700"]
                url = f"redis+socket://{folder / 'redis.sock'}"
            else:
                url = f"redis://127.0.0.1:{port}/0"
            procs.append(subprocess.Popen(argv, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            # A long socket timeout: MONITOR's connection waits for as long as the worker takes to start.
            client = redis.Redis.from_url(redis_urls.for_redis_py(url), decode_responses=True, socket_timeout=300)
            wait_until(lambda: _pings(client), 20, f"the {request.param} redis-server")
        yield url, client
    finally:
        if group:
            group.stop()
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _answer(flower: Flower, path: str) -> dict:
    """Flower's JSON at ``path``, or {} while it answers otherwise (starting, or the worker not yet seen)."""
    status, body = flower.get(path)
    return json.loads(body) if status == 200 else {}


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_a_worker_on_each_scheme_pops_and_records_a_delivery_in_one_script(server, tmp_path):
    """The worker waits on the doorbell, never the queue; the message's ``unacked`` record is written by the
    script that pops it. kombu's BRPOP of the queue, or a pop whose record follows in a second round trip
    (kombu's QoS.append), leaves a moment where a Redis lost has the message nowhere: both fail here."""
    url, client = server
    monitor = Monitor(client)
    log_path = tmp_path / "worker.log"
    env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "celery", "-A", "tests.faults.delivery_app", "worker", "-P", "solo", "-c", "1"]
    argv += ["-Q", "q1", "-n", "w1@schemes", "-l", "INFO", "--without-gossip", "--without-mingle"]
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    flower = Flower(env, tmp_path / "flower.log", "admin:pw")
    try:
        wait_until(lambda: "ready." in log_path.read_text() or worker.poll() is not None, 120, "the worker")
        assert worker.poll() is None, log_path.read_text()
        # framefleet's own client, in the worker (its heartbeat) and here, on this URL
        own = connect(url, decode_responses=True)
        wait_until(lambda: own.exists("ff:worker:w1@schemes"), 30, "the worker's heartbeat through framefleet's client")
        flower.wait_ready()  # Flower's Celery connection and its own broker client, each on this URL
        wait_until(lambda: "w1@schemes" in _answer(flower, "/api/workers?refresh=1"), 30, "Flower to reach the worker")
        lengths = wait_until(lambda: _answer(flower, "/api/queues/length").get("active_queues"), 30, "queue lengths")
        assert [q["name"] for q in lengths] == ["q1"], lengths
        broker, options = redis_urls.for_celery(url)
        sender = Celery("sender", broker=broker, set_as_current=False)
        sender.conf.broker_transport_options = {**app.conf.broker_transport_options, **options}
        sender.send_task("faults.work", ("t1", 0), queue="q1", ignore_result=True)
        sender.close()
        wait_until(lambda: "RUN t1 end" in log_path.read_text(), 60, "the task to run")
        wait_until(lambda: client.hlen("unacked") == 0, 20, "the ack")
    finally:
        flower.stop()
        worker.kill()
        worker.wait()
    assert monitor.ended is None, f"MONITOR stopped early: {monitor.ended!r}"
    commands = [(c["client_type"] == "lua", c["command"].split()) for c in monitor.commands]
    brpops = [words for lua, words in commands if not lua and words[0].upper() == "BRPOP"]
    assert brpops and all(key.startswith("ff:bell:") for words in brpops for key in words[1:-1]), brpops
    in_script = [words for lua, words in commands if lua]
    assert any(w[0].upper() == "RPOP" and w[1].startswith("q1") for w in in_script), "no pop of q1 in a script"
    assert any(w[0].upper() == "HSET" and w[1] == "unacked" for w in in_script), "the pop's script wrote no record"
    outside = [w for lua, w in commands if not lua and w[0].upper() in ("HSET", "ZADD") and w[1].startswith("unacked")]
    assert not [w for w in outside if w[0].upper() == "HSET" or "NX" not in (x.upper() for x in w)], outside

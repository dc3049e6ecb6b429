"""A Redis URL as users write it: a password with any character (`;` included) reaches Redis and never a log or a
message; a bad port or TLS option is one line naming the fix; `rediss://` verifies the server unless told not to,
and says so when told. A real worker, `framefleet status` and Flower on a real Redis whose password holds `;`."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from tasks import redis_urls
from tests.conftest import ROOT, Workers, process_env, run_script, start_redis_server
from tests.test_flower_monitoring import Flower

pytestmark = pytest.mark.timeout(180)

# Every character a shell, Celery or a URL parser could take for something else.
PASSWORD = "p;w$x&y`z"


def settings_error(url: str) -> subprocess.CompletedProcess:
    """A program loading its settings with REDIS_URL=``url``, as every framefleet program starts."""
    return subprocess.run(
        [sys.executable, "-c", "from tasks import settings; settings()"],
        cwd=ROOT,
        env={**process_env(url), "FRAMEFLEET_REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "url, said",
    [
        ("sentinel://:s3cretPW@h1:26379;sentinel://h2:26379/0", "master_name=NAME"),
        ("sentinel://:s3cretPW@h1:notaport/0?master_name=m", "is not a number"),
        ("redis://:s3cretPW@host:notaport/0", "is not a number"),
        ("rediss://:s3cretPW@host:6380/0?ssl_cert_reqs=sometimes", "not one of required, optional, none"),
    ],
)
def test_a_refused_url_is_one_line_naming_the_fix_without_its_password(url, said):
    done = settings_error(url)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert "s3cretPW" not in done.stderr + done.stdout and "***" in done.stderr


def test_a_password_with_a_semicolon_is_one_address_masked_and_percent_encoded_for_celery():
    url = f"redis://:{PASSWORD}@127.0.0.1:6379/0"
    assert redis_urls.redact(url) == "redis://:***@127.0.0.1:6379/0"
    celery_url, _ = redis_urls.for_celery(url)
    assert ";" not in celery_url and redis.connection.parse_url(celery_url)["password"] == PASSWORD
    sentinel = f"sentinel://:{PASSWORD}@a:1;sentinel://:{PASSWORD}@b:2/0?master_name=m"
    assert redis_urls.sentinels(sentinel).hosts == (("a", 1), ("b", 2))
    assert redis_urls.sentinels(sentinel).password == PASSWORD
    assert PASSWORD not in redis_urls.redact(sentinel) and redis_urls.redact(sentinel).count("***") == 2
    assert redis_urls.for_celery(sentinel)[0].count(";") == 1


def test_rediss_without_ssl_cert_reqs_verifies_the_server_and_none_is_taken_with_a_warning(caplog):
    celery_url, _ = redis_urls.for_celery("rediss://:pw@host:6380/0")
    assert celery_url.endswith("?ssl_cert_reqs=required")
    assert redis_urls.ssl_options("rediss://:pw@host:6380/0") == {"ssl_cert_reqs": 2}  # ssl.CERT_REQUIRED
    with caplog.at_level(logging.WARNING, logger="framefleet"):
        redis_urls.check("rediss://:pw@host:6380/0?ssl_cert_reqs=none")
    assert "certificate is not checked" in caplog.text and "pw@" not in caplog.text


def test_a_worker_on_rediss_without_ssl_cert_reqs_builds_its_result_backend(monkeypatch):
    import tasks.celery_app

    before = tasks.celery_app.settings()
    monkeypatch.setenv("REDIS_URL", "rediss://:pw@127.0.0.1:6380/0")
    try:
        tasks.celery_app.configure(tasks.celery_app.load_settings())
        assert tasks.celery_app.app.backend.connparams["ssl_cert_reqs"] == 2  # Celery's refusal was a traceback
    finally:
        tasks.celery_app.configure(before)


@pytest.fixture
def redis_with_odd_password() -> Iterator[str]:
    """A redis-server of this test alone whose password holds ``;``, ``$``, ``&`` and a backtick."""
    url, stop = start_redis_server()
    redis.Redis.from_url(url).config_set("requirepass", PASSWORD)
    yield url.replace("redis://", f"redis://:{PASSWORD}@") + "/0"
    stop()


def test_a_worker_status_and_flower_run_on_a_redis_whose_password_holds_a_semicolon(redis_with_odd_password, tmp_path):
    env = process_env(redis_with_odd_password)
    workers = Workers(env, tmp_path / "logs")
    flower = None
    try:
        workers.start("cpu")  # it registers in Redis: it connected, broker and client alike
        shown = run_script("status.py", env=env, timeout_s=60)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert PASSWORD not in shown.stdout + shown.stderr and "redis://:***@127.0.0.1" in shown.stdout
        flower_env = {k: v for k, v in env.items() if not k.startswith("FLOWER_")}
        flower = Flower(flower_env, tmp_path / "flower.log", "ops:s3cret", "--address=127.0.0.1")
        flower.wait_ready()
        assert flower.get("/api/workers")[0] == 200
        assert "could not be cast" not in flower.log.read_text()
        assert PASSWORD not in workers.log("cpu") and "could not be cast" not in workers.log("cpu")
    finally:
        if flower is not None:
            flower.stop()
        workers.stop_all()

"""`framefleet run` on the Redis it is told of: one that does not answer, or refuses its password, is an error
naming it, before any process starts (never a private Redis in its place)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import free_port, wait_until
from tests.test_runs import ff

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def guarded_redis(tmp_path) -> Iterator[int]:
    """A redis-server of this test's own that asks for the password ``s3cret``; its port."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; the tests start their own (apt install redis-server)")
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--requirepass", "s3cret"]
    proc = subprocess.Popen([*argv, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def answers() -> bool:
        try:
            return bool(redis.Redis(port=port, password="s3cret").ping())
        except redis.RedisError:
            return False

    try:
        wait_until(answers, 10, "the password-guarded redis-server")
        yield port
    finally:
        proc.kill()
        proc.wait()


def test_a_redis_url_that_does_not_answer_is_an_error_naming_it(video_factory, pipeline_env, tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    out = tmp_path / "out"
    done = ff("run", str(video_factory(1)), "--out", str(out), env={**pipeline_env, "REDIS_URL": url}, timeout_s=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"REDIS_URL names {url}, which does not answer (ConnectionError" in done.stderr, done.stderr
    assert "private redis-server at" not in done.stdout and not (out / "logs").exists()  # nothing started


def test_a_redis_url_whose_password_is_refused_is_an_error_naming_it_without_the_password(
    video_factory, pipeline_env, guarded_redis, tmp_path
):
    url = f"redis://:wrong-pass@127.0.0.1:{guarded_redis}/0"
    out = tmp_path / "out"
    done = ff("run", str(video_factory(1)), "--out", str(out), env={**pipeline_env, "REDIS_URL": url}, timeout_s=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"REDIS_URL names redis://:***@127.0.0.1:{guarded_redis}/0, which does not answer" in done.stderr
    assert "AuthenticationError" in done.stderr and "wrong-pass" not in done.stderr + done.stdout, done.stderr
    assert not (out / "logs").exists()

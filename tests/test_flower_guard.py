"""Flower locked however it is started: beyond loopback without auth it refuses, and so does a guard that errs."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, wait_until
from tests.test_flower_monitoring import Flower

pytestmark = pytest.mark.timeout(120)

WRAPPER = "#!{python}\nimport sys\nfrom flower.__main__ import main\nsys.exit(main())\n"


def launcher(how: str, tmp_path: Path) -> list[str]:
    """The start of a command line that runs Flower ``how``: as a module, a console script, or a wrapper."""
    if how == "python -m flower":
        return [sys.executable, "-m", "flower"]
    if how == "celery":
        return [str(Path(sys.executable).parent / "celery")]
    # A `flower` program as packagers install it, and one named otherwise (which only the server lock sees).
    script = tmp_path / ("flower" if how == "flower" else "serve-the-monitor")
    script.write_text(WRAPPER.format(python=sys.executable))
    script.chmod(0o755)
    return [str(script)]


def without_flower_settings(env: dict[str, str]) -> dict[str, str]:
    """``env`` without FLOWER_* variables (the test's own settings decide whether Flower has a login)."""
    return {k: v for k, v in env.items() if not k.startswith("FLOWER_")}


def run_flower(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Flower started with ``argv`` and run to its end (a refused one exits at once; a served one times out)."""
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("how", ["python -m flower", "celery", "flower", "another name"])
def test_flower_beyond_loopback_without_auth_refuses_however_it_is_started(pipeline_env, tmp_path, how):
    env = without_flower_settings(pipeline_env)
    port = free_port()
    done = run_flower([*launcher(how, tmp_path), "-A", "tasks", "flower", "--address=0.0.0.0", f"--port={port}"], env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"Flower would listen on 0.0.0.0:{port}, beyond loopback, without authentication" in done.stderr
    assert "FLOWER_BASIC_AUTH=user:password" in done.stderr and not listening(port)


def test_python_m_flower_with_auth_serves_only_who_logs_in(pipeline_env, tmp_path):
    env = without_flower_settings(pipeline_env)
    app = Flower(env, tmp_path / "flower.log", "ops:s3cret", "--address=0.0.0.0", program=("-m", "flower"))
    try:
        app.wait_ready()
        assert app.get("/api/workers", auth=None)[0] == 401
        assert app.get("/api/workers")[0] == 200
    finally:
        app.stop()


def test_a_guard_that_cannot_read_flowers_options_refuses(pipeline_env):
    env = without_flower_settings(pipeline_env)
    argv = ["celery", "-A", "tasks", "flower", "--address=0.0.0.0"]
    done = run_flower(
        [sys.executable, "-c", f"from tasks.observe.flower_guard import check; check({argv!r})"],
        {**env, "FLOWER_PORT": "not-a-port"},  # Flower's own parser raises on it
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "could not tell whether Flower would listen beyond loopback" in done.stderr
    assert "ValueError" in done.stderr and "Traceback" not in done.stderr


def _over_socket(path: Path, url: str) -> str:
    """The status line of a GET of ``url`` from an HTTP server on the Unix socket ``path``, "" when none answers."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(path))
            s.sendall(f"GET {url} HTTP/1.0\r\nHost: flower\r\n\r\n".encode())
            return s.recv(4096).decode(errors="replace").partition("\r\n")[0]
    except OSError:
        return ""


def test_flower_on_a_unix_socket_without_auth_serves_only_from_a_folder_no_one_else_can_enter(pipeline_env, tmp_path):
    """Flower makes its Unix socket mode 0777: in a folder others can enter, any user of the host could read it."""
    env = without_flower_settings(pipeline_env)
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir(mode=0o755)
    private.mkdir(mode=0o700)
    shared.chmod(0o755)  # whatever the umask
    private.chmod(0o700)
    command = [sys.executable, "-m", "celery", "-A", "tasks", "flower"]
    refused = run_flower([*command, f"--unix-socket={shared / 'flower.sock'}"], env)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert f"Flower would listen on the Unix socket {shared / 'flower.sock'} without authentication" in refused.stderr
    assert "mkdir -m 700" in refused.stderr and not (shared / "flower.sock").exists()
    sock, log = private / "flower.sock", tmp_path / "flower.log"
    with open(log, "wb") as out:
        served = subprocess.Popen(
            [*command, f"--unix-socket={sock}"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_until(lambda: "200" in _over_socket(sock, "/healthcheck") or served.poll() is not None, 60, "Flower")
        assert served.poll() is None, log.read_text()
        assert _over_socket(sock, "/tasks").endswith("200 OK")  # no login: the folder is the lock
    finally:
        served.terminate()
        served.wait(timeout=30)


def http_status(port: int, path: str) -> tuple[int, str]:
    """The status of a GET of ``path`` without a login from Flower on ``port`` of loopback (0: none answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def started_or_refused(argv: list[str], env: dict[str, str], port: int, log: Path) -> tuple[int | None, int]:
    """Start Flower; return (its exit status, or None while it serves; the status of an unauthenticated GET of
    /api/workers, 0 when nothing answers). A served one is stopped."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: proc.poll() is not None or listening(port), 60, "Flower to listen or exit")
        if proc.poll() is not None:
            return proc.returncode, 0
        wait_until(lambda: http_status(port, "/healthcheck")[0] == 200, 30, "Flower to answer")
        return None, http_status(port, "/api/workers")[0]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.mark.parametrize("name", ["tasks", "tasks.celery_app", "tasks.celery_app:app", "a module of the user's"])
def test_flower_is_guarded_whatever_name_loads_framefleets_app(pipeline_env, tmp_path, name):
    env = without_flower_settings(pipeline_env)
    if name == "a module of the user's":
        (tmp_path / "monitor_app.py").write_text("from tasks.celery_app import app\n")
        env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
        name = "monitor_app:app"
    port = free_port()
    argv = [*launcher("celery", tmp_path), "-A", name, "flower", "--address=0.0.0.0", f"--port={port}"]
    status, unauthenticated = started_or_refused(argv, env, port, tmp_path / "flower.log")
    assert (status, unauthenticated) == (2, 0), (name, unauthenticated, (tmp_path / "flower.log").read_text())
    assert "beyond loopback, without authentication" in (tmp_path / "flower.log").read_text()


@pytest.mark.parametrize("how", ["--auth_provider", "FLOWER_AUTH_PROVIDER"])
def test_an_oauth_provider_without_auth_is_no_login_and_refused(pipeline_env, tmp_path, how):
    """Flower asks for an OAuth login only when --auth names who may log in; a provider alone serves everyone."""
    env = without_flower_settings(pipeline_env)
    provider = "flower.views.auth.GithubLoginHandler"
    port = free_port()
    argv = [*launcher("celery", tmp_path), "-A", "tasks", "flower", "--address=0.0.0.0", f"--port={port}"]
    if how == "--auth_provider":
        argv.append(f"--auth_provider={provider}")
    else:
        env["FLOWER_AUTH_PROVIDER"] = provider
    status, unauthenticated = started_or_refused(argv, env, port, tmp_path / "flower.log")
    log = (tmp_path / "flower.log").read_text()
    assert (status, unauthenticated) == (2, 0), (unauthenticated, log)
    assert f"OAuth provider ({provider}) without --auth" in log and "--auth=" in log

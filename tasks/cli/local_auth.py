"""The credentials of `framefleet run`'s own services: Flower's login and the private Redis's password.

Each is random per run unless the operator gives one, is written to a file only its owner can read
(mode 0600) and reaches the processes that need it through their environment, never a command line
(which every local user can read in ``ps``).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from tasks.run import own_redis

FLOWER_USER = "framefleet"
FLOWER_FILE = "flower-auth.txt"
REDIS_FILE = own_redis.FILE_NAME
SECRET_FILES = (FLOWER_FILE, REDIS_FILE)  # kept in OUT/logs across runs, not rotated to previous/


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` and a newline to ``path`` with mode 0600 (also when the file was already there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(text + "\n")


def flower_auth(env: dict[str, str], logs: Path) -> tuple[dict[str, str], str]:
    """Return Flower's environment with basic auth and a line saying who logs in and where the password is.

    $FLOWER_BASIC_AUTH is passed through; without it a random password is written to
    ``logs/flower-auth.txt`` (mode 0600). The password itself is never printed.
    """
    if env.get("FLOWER_BASIC_AUTH"):
        user = env["FLOWER_BASIC_AUTH"].split(",")[0].partition(":")[0]
        return env, f"user {user}, password from $FLOWER_BASIC_AUTH"
    pair = f"{FLOWER_USER}:{secrets.token_urlsafe(18)}"
    path = logs / FLOWER_FILE
    write_secret(path, pair)
    return {**env, "FLOWER_BASIC_AUTH": pair}, f"user {FLOWER_USER}, password in {path}"


def redis_config(folder: Path) -> tuple[Path, str]:
    """Write a redis-server configuration file asking for a new random password into ``folder`` (mode 0600);
    return its path and the password. The file, not ``--requirepass``, keeps it off the command line."""
    password = secrets.token_urlsafe(24)  # URL-safe: it goes into redis://:<password>@host unquoted
    path = folder / "redis.conf"
    write_secret(path, f"requirepass {password}")
    return path, password


def redis_url(port: int, password: str) -> str:
    """The URL of the private Redis on 127.0.0.1:``port`` with ``password``."""
    return f"redis://:{password}@127.0.0.1:{port}/0"

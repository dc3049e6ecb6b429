"""Flower must not listen beyond loopback without authentication, however it is started.

Flower loads the app before it serves, and the app's module (tasks.celery_app) calls ``guard`` as it is
built, whatever ``-A`` names it by (``tasks``, ``tasks.celery_app:app``, a module importing it) and whatever
starts Flower: ``celery -A tasks flower``, ``python -m celery``, ``python -m flower -A tasks flower`` or a
``flower`` script. Two locks, each ending the process with exit status 2 and the fix:

- ``check``, at import, when ``sys.argv`` is a Flower command line: it resolves Flower's own options
  (its ``FLOWER_*`` variables, command line and config file, with Flower's own parsers);
- ``lock_server``, for a Flower that has loaded already whatever its command line: Flower's
  ``start_http_server`` checks the options Flower itself resolved before it binds a socket.

A guard that cannot decide (an option it cannot read, an error of its own) refuses: an open Flower
is worse than one that does not start.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Options of the `celery` command that take a value, so that value is not taken for the subcommand.
CELERY_VALUE_OPTIONS = {"-A", "--app", "-b", "--broker", "--result-backend", "--loader", "--config", "--workdir"}
# The programs that start Flower: `celery`, `flower`, and `python -m celery` / `python -m flower`.
FLOWER_PROGRAMS = ("celery", "flower")
EXIT_STATUS = 2
STATE = {"guarded": False}


def flower_args(argv: Sequence[str]) -> list[str] | None:
    """Return Flower's arguments when ``argv`` is ``celery|flower [options] flower [args]``, else None."""
    if not argv:
        return None
    prog = Path(argv[0])
    if prog.name not in FLOWER_PROGRAMS and not (prog.name == "__main__.py" and prog.parent.name in FLOWER_PROGRAMS):
        return None
    args = iter(enumerate(argv[1:], start=1))
    for i, arg in args:
        if arg in CELERY_VALUE_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            return list(argv[i + 1 :]) if arg == "flower" else None
    return None


def is_loopback(address: str) -> bool:
    """True for an address that only this host can reach; Flower's default ("") is every interface."""
    if address.strip("[]").lower() in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False  # "" (every interface), or a host name that may resolve anywhere


def options_problem(options: Any) -> str | None:
    """Why Flower with the resolved ``options`` (tornado's) may not start, or None when it may."""
    basic = [pair for pair in options.basic_auth or [] if _user_and_password(pair)]
    if basic:
        return None
    if options.auth_provider and not options.auth:
        # Flower asks for an OAuth login only when --auth is set (flower/views/__init__.py, get_current_user).
        return (
            f"Flower was given an OAuth provider ({options.auth_provider}) without --auth, and then asks for no "
            "login at all. Add --auth (FLOWER_AUTH) with a regular expression of the e-mail addresses allowed, "
            "e.g. --auth='.*@example\\.org', or set FLOWER_BASIC_AUTH=user:password in its environment."
        )
    if options.auth:
        return None
    if options.unix_socket:
        return _socket_problem(Path(options.unix_socket))
    if is_loopback(options.address):
        return None
    where = f"{options.address}:{options.port}" if options.address else f"port {options.port} of every interface"
    return (
        f"Flower would listen on {where}, beyond loopback, without authentication. Set "
        "FLOWER_BASIC_AUTH=user:password in its environment (or --basic-auth=user:password; "
        "OAuth through --auth with --auth_provider also counts), or bind it to loopback with "
        "--address=127.0.0.1."
    )


def _socket_problem(path: Path) -> str | None:
    """Why Flower may not serve on the Unix socket ``path`` without a login, or None: Flower makes the socket mode
    0777 (flower/app.py, ``start_http_server``), so only its folder can keep other users of the host out, and
    it must be this user's and closed to everyone else."""
    folder = path.expanduser().absolute().parent
    try:
        st = folder.stat()
    except OSError as exc:
        return f"cannot read the folder of Flower's Unix socket {path} ({exc}); Flower does not start"
    if st.st_uid == os.getuid() and not st.st_mode & 0o077:
        return None
    return (
        f"Flower would listen on the Unix socket {path} without authentication, and Flower makes that socket "
        f"mode 0777: any user of this host who can enter {folder} could read it (every task, its video and run). "
        f"Put the socket in a folder only you can enter (mkdir -m 700 DIR), or set FLOWER_BASIC_AUTH=user:password "
        "in its environment (or --basic-auth=user:password)."
    )


def auth_problem(prog: str, args: Sequence[str]) -> str | None:
    """Resolve Flower's options as Flower will; return why it may not start, or None when it may."""
    from flower.command import apply_env_options, apply_options
    from tornado.options import options

    apply_env_options()
    apply_options(prog, list(args))
    return options_problem(options)


def undecided(exc: BaseException) -> str:
    """The refusal when the guard could not resolve Flower's options."""
    return (
        f"could not tell whether Flower would listen beyond loopback without authentication "
        f"({type(exc).__name__}: {exc}), so it does not start. Fix the option or FLOWER_* variable named "
        f"there; set FLOWER_BASIC_AUTH=user:password, or bind it to loopback with --address=127.0.0.1."
    )


def refuse(problem: str) -> None:
    print(f"framefleet: {problem}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_STATUS)


def check(argv: Sequence[str] | None = None) -> None:
    """Exit with status 2 and the fix when ``argv`` (default ``sys.argv``) starts an open Flower, or one whose
    options the guard cannot resolve."""
    argv = sys.argv if argv is None else argv
    args = flower_args(argv)
    if args is None:
        return
    from tasks.observe.flower_view import default_columns

    default_columns(args)
    try:
        problem = auth_problem(argv[0], args)
    except Exception as exc:
        problem = undecided(exc)
    if problem:
        refuse(problem)


def guard() -> None:
    """Both locks, once per process: the command line's check and the server's (the app's module calls this)."""
    if STATE["guarded"]:
        return
    STATE["guarded"] = True
    check()
    lock_server()


def lock_server() -> None:
    """Make every Flower of this process check its resolved options before it binds a socket (``refuse``).

    Only where Flower is loaded already (every ``celery`` and ``flower`` command loads it before the app);
    a worker does not import it for this.
    """
    module = sys.modules.get("flower.app")
    flower = getattr(module, "Flower", None)
    if flower is None or getattr(flower.start_http_server, "framefleet_locked", False):
        return
    flower.start_http_server = _locked(flower.start_http_server)


def _locked(start: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(start)
    def start_http_server(self: Any) -> Any:
        try:
            problem = options_problem(self.options)
        except Exception as exc:
            problem = undecided(exc)
        if problem:
            refuse(problem)
        return start(self)

    start_http_server.framefleet_locked = True  # type: ignore[attr-defined]
    return start_http_server


def _user_and_password(pair: str) -> bool:
    user, sep, password = pair.partition(":")
    return bool(user and sep and password)

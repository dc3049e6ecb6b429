"""Flower must not listen beyond loopback without authentication.

``celery -A tasks flower`` loads the app (``tasks.app``), and with it this module, before it runs
Flower, so the check runs at import, when ``sys.argv`` is a Flower command line: it resolves Flower's own options (its
``FLOWER_*`` variables, command line and config file, with Flower's own parsers) and ends the
process with exit status 2 and the fix when the address is not loopback and no auth is set.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Sequence
from pathlib import Path

# Options of the `celery` command that take a value, so that value is not taken for the subcommand.
CELERY_VALUE_OPTIONS = {"-A", "--app", "-b", "--broker", "--result-backend", "--loader", "--config", "--workdir"}
EXIT_STATUS = 2


def flower_args(argv: Sequence[str]) -> list[str] | None:
    """Return Flower's arguments when ``argv`` is ``celery [options] flower [args]``, else None."""
    if not argv:
        return None
    prog = Path(argv[0])
    if prog.name != "celery" and not (prog.name == "__main__.py" and prog.parent.name == "celery"):
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


def auth_problem(prog: str, args: Sequence[str]) -> str | None:
    """Resolve Flower's options as Flower will; return why it may not start, or None when it may."""
    from flower.command import apply_env_options, apply_options
    from tornado.options import options

    apply_env_options()
    apply_options(prog, list(args))
    if options.unix_socket or is_loopback(options.address):
        return None
    basic = [pair for pair in options.basic_auth or [] if _user_and_password(pair)]
    if basic or options.auth or options.auth_provider:
        return None
    where = f"{options.address}:{options.port}" if options.address else f"port {options.port} of every interface"
    return (
        f"Flower would listen on {where}, beyond loopback, without authentication. Set "
        "FLOWER_BASIC_AUTH=user:password in its environment (or --basic-auth=user:password; "
        "OAuth through --auth and --auth_provider also counts), or bind it to loopback with "
        "--address=127.0.0.1."
    )


def check(argv: Sequence[str] | None = None) -> None:
    """Exit with status 2 and the fix when ``argv`` (default ``sys.argv``) starts an open Flower."""
    argv = sys.argv if argv is None else argv
    args = flower_args(argv)
    if args is None:
        return
    from tasks.observe.flower_view import default_columns

    default_columns(args)
    try:
        problem = auth_problem(argv[0], args)
    except Exception:  # an argument Flower cannot parse: Flower itself reports it and exits
        return
    if problem:
        print(f"framefleet: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STATUS)


def _user_and_password(pair: str) -> bool:
    user, sep, password = pair.partition(":")
    return bool(user and sep and password)


check()

"""The Redis URLs every framefleet program takes, and the form each library is handed them in.

One URL names one Redis for every program (workers, CLI, autoscaler, Flower), so everything a
connection needs is in it:

- ``redis://[[user]:password@]host[:port][/db]``: plain TCP.
- ``rediss://…?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.crt`` (and ``ssl_certfile``,
  ``ssl_keyfile``): TLS, the options as Celery and redis-py read them.
- ``redis+socket:///path/redis.sock[?virtual_host=db]`` (Celery's form) or ``unix:///path/redis.sock[?db=db]``
  (redis-py's form): a Unix socket.
- ``sentinel://[[user]:password@]host:port[/db];sentinel://host:port;…?master_name=NAME``: the Redis
  that the Sentinels at these addresses name as ``NAME``'s primary (the password is the primary's).
  Celery takes the master name as a transport option; framefleet reads it from the URL and hands it
  to Celery, kombu and redis-py itself, so that no program needs a setting of its own for it.

A password may hold any character, ``;`` included (Celery reads ``;`` as a list of failover URLs: the
password goes to Celery percent-encoded); ``/``, ``?``, ``#`` and ``@`` in one are written ``%2F``, ``%3F``,
``%23``, ``%40``. A ``rediss://`` URL without ``ssl_cert_reqs`` verifies the server's certificate
(``required``, redis-py's default); ``ssl_cert_reqs=none`` is taken with a warning. Every message about a
URL shows it with its passwords as ``***``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

log = logging.getLogger("framefleet")

SCHEMES = ("redis", "rediss", "redis+socket", "unix", "sentinel")
EXAMPLES = (
    "redis://127.0.0.1:6379/0, rediss://:PASSWORD@host:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.crt, "
    "redis+socket:///run/redis/redis.sock, or "
    "sentinel://host1:26379;sentinel://host2:26379;sentinel://host3:26379/0?master_name=mymaster"
)


# The values of ssl_cert_reqs Celery, kombu and redis-py all take, by what each means.
CERT_REQS = {
    "required": "required",
    "cert_required": "required",
    "optional": "optional",
    "cert_optional": "optional",
    "none": "none",
    "cert_none": "none",
}
# The spellings Celery's result backend takes (celery/backends/redis.py); others are rewritten for it.
CELERY_CERT_REQS = ("required", "optional", "none", "CERT_REQUIRED", "CERT_OPTIONAL", "CERT_NONE")
# Between two addresses of a Sentinel URL; a ";" elsewhere (in a password) is part of its address.
_NEXT_SENTINEL = re.compile(r";(?=sentinel://)")
_warned: set[str] = set()


class RedisURLError(ValueError):
    """A Redis URL framefleet cannot use; the message names the URL's problem and the forms it takes."""


@dataclass(frozen=True)
class Sentinels:
    """A Redis behind Sentinel: the Sentinels' addresses, the primary's name, its database and credentials."""

    hosts: tuple[tuple[str, int], ...]
    master_name: str
    db: int
    username: str | None
    password: str | None


def scheme_of(url: str) -> str:
    """The scheme of ``url`` (one of SCHEMES); raises RedisURLError for any other."""
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise RedisURLError(f"must be a Redis URL such as {EXAMPLES}; got the scheme {scheme or '(none)'!r}")
    return scheme


def check(url: str) -> str:
    """Return ``url`` when every framefleet program can use it; raises RedisURLError saying why not (its
    passwords shown as ***). Warns, once per URL, of a ``rediss://`` URL that does not verify the server."""
    scheme = scheme_of(url)
    if scheme == "sentinel":
        sentinels(url)
    elif scheme in ("redis", "rediss"):
        _port(url, 6379)
        if scheme == "rediss":
            _cert_reqs(url)
    return url


def addresses(url: str) -> list[str]:
    """The addresses of ``url``: one, or each ``sentinel://…`` of a Sentinel URL (a ``;`` in a password stays)."""
    return _NEXT_SENTINEL.split(url) if url.startswith("sentinel://") else [url]


def _port(chunk: str, default: int) -> int:
    try:
        return urlsplit(chunk).port or default
    except ValueError:
        raise RedisURLError(
            f"the port of {redact(chunk)} is not a number: write host:port with a number (…@host:6379/0), and a "
            "password's '/', '?', '#' or '@' as %2F, %3F, %23 or %40"
        ) from None


def _cert_reqs(url: str) -> str:
    """The ``ssl_cert_reqs`` of a ``rediss://`` URL (``required`` when it names none); raises RedisURLError for a
    value no library takes, and warns once of ``none`` (the server's certificate is not checked)."""
    given = dict(parse_qsl(urlsplit(url).query)).get("ssl_cert_reqs", "required")
    found = CERT_REQS.get(given.lower())
    if found is None:
        raise RedisURLError(
            f"ssl_cert_reqs={given!r} in {redact(url)} is not one of required, optional, none; write "
            "ssl_cert_reqs=required (and ssl_ca_certs=/path/ca.crt for a private CA)"
        )
    if found == "none" and url not in _warned:
        _warned.add(url)
        log.warning(
            "%s: ssl_cert_reqs=none: the connection is encrypted but the server's certificate is not checked, so "
            "anyone between this host and Redis can pose as it and read its password; use ssl_cert_reqs=required "
            "and ssl_ca_certs=/path/ca.crt",
            redact(url),
        )
    return found


def _encoded(url: str) -> str:
    """``url`` with its user name and password percent-encoded (a ``;`` in one would split it for Celery)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    user = quote(unquote(parts.username or ""), safe="")
    auth = f"{user}:{quote(unquote(parts.password), safe='')}" if parts.password is not None else user
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{auth}@{host}", parts.path, parts.query, parts.fragment))


def _with_cert_reqs(url: str) -> str:
    """A ``rediss://`` ``url`` that names its ``ssl_cert_reqs`` as Celery's result backend reads it (it refuses one
    that does not); ``url`` itself when it does."""
    parts = urlsplit(url)
    if dict(parse_qsl(parts.query)).get("ssl_cert_reqs") in CELERY_CERT_REQS:
        return url
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "ssl_cert_reqs"]
    query.append(("ssl_cert_reqs", _cert_reqs(url)))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def sentinels(url: str) -> Sentinels:
    """Read a ``sentinel://…;sentinel://…?master_name=NAME`` URL; raises RedisURLError when a part is missing."""
    hosts: list[tuple[str, int]] = []
    query: dict[str, str] = {}
    dbs, creds = set(), set()
    for chunk in addresses(url):
        parts = urlsplit(chunk)
        port = _port(chunk, 26379)
        hosts.append((parts.hostname or "127.0.0.1", port))
        query.update(parse_qsl(parts.query))
        if parts.path.strip("/"):
            dbs.add(parts.path.strip("/"))
        if parts.username is not None or parts.password is not None:
            creds.add((unquote(parts.username or "") or None, unquote(parts.password or "") or None))
    master_name = query.pop("master_name", "")
    if not master_name:
        raise RedisURLError(
            "a Sentinel URL names the primary it asks the Sentinels for: add ?master_name=NAME (the name in "
            "sentinel.conf's `sentinel monitor NAME …`), e.g. sentinel://h1:26379;sentinel://h2:26379/0?master_name=mymaster"
        )
    if query:
        raise RedisURLError(f"a Sentinel URL takes only master_name in its query; got {sorted(query)}")
    if len(dbs) > 1 or len(creds) > 1:
        raise RedisURLError(f"the addresses of a Sentinel URL name different databases or passwords: {dbs or ''}")
    db = dbs.pop() if dbs else "0"
    if not db.isdigit():
        raise RedisURLError(f"a Sentinel URL's database is a number (…:26379/0); got {db!r}")
    username, password = creds.pop() if creds else (None, None)
    return Sentinels(tuple(hosts), master_name, int(db), username, password)


def for_celery(url: str) -> tuple[str, dict[str, Any]]:
    """The URL Celery and kombu are given for ``url``, and the transport options it needs (Sentinel's master name).

    A Sentinel URL names its database and credentials in every address (kombu reads the first, Celery's
    result backend each) and the master name leaves the URL for the options; ``unix://`` becomes
    ``redis+socket://``, the form both read.
    """
    scheme = scheme_of(url)
    if scheme == "unix":
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        db = query.pop("db", None)
        if db is not None:
            query["virtual_host"] = db
        return f"redis+socket://{parts.path}" + (f"?{urlencode(query)}" if query else ""), {}
    if scheme == "rediss":
        return _with_cert_reqs(_encoded(url)), {}
    if scheme != "sentinel":
        return _encoded(url), {}
    found = sentinels(url)
    auth = ""
    user, password = quote(found.username or "", safe=""), quote(found.password or "", safe="")
    if user or password:
        auth = f"{user}:{password}@" if password else f"{user}@"
    chunks = [f"sentinel://{auth}{host}:{port}/{found.db}" for host, port in found.hosts]
    return ";".join(chunks), {"master_name": found.master_name}


def ssl_options(url: str) -> dict[str, Any] | None:
    """The ``ssl_*`` options of a ``rediss://`` URL as Celery's ``broker_use_ssl`` takes them (Flower's broker view
    reads only that setting); None for other schemes."""
    if scheme_of(url) != "rediss":
        return None
    from kombu.utils.url import parse_ssl_cert_reqs

    options: dict[str, Any] = {k: v for k, v in parse_qsl(urlsplit(url).query) if k.startswith("ssl_")}
    options["ssl_cert_reqs"] = parse_ssl_cert_reqs(_cert_reqs(url))
    return options


def for_redis_py(url: str) -> str:
    """The URL redis-py's ``Redis.from_url`` reads for a non-Sentinel ``url`` (``redis+socket://`` → ``unix://``)."""
    scheme = scheme_of(url)
    if scheme == "rediss":
        return _with_cert_reqs(_encoded(url))
    if scheme != "redis+socket":
        return _encoded(url) if scheme == "redis" else url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    db = query.pop("virtual_host", None)
    if db is not None:
        query["db"] = db.strip("/")
    return f"unix://{parts.path}" + (f"?{urlencode(query)}" if query else "")


def redact(url: str) -> str:
    """Return ``url`` with every password replaced by ***, for logs and summaries (each address of a Sentinel URL)."""
    return ";".join(_redact_one(chunk) for chunk in addresses(url))


def _redact_one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://***@{host}"

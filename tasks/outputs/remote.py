"""Object-store roots (``s3://``, ``gs://``, ``az://`` through fsspec), worked on through a folder of this host.

A root URL maps to one folder, ``<cache>/<scheme>/<bucket>/<quoted prefix>`` (``mirror_of``): the same
path on every host with the same ``FRAMEFLEET_OBJECT_CACHE``, so jobs, claims and confinement name
it as they name a shared disk's folder. The bucket is the truth and the folder its working copy:

- a file written through ``storage.atomic_write`` is uploaded (``publish``) before it is renamed
  into place, so a failed upload changes nothing here either;
- an exactly-once output (a dataset file, its completion marker) is uploaded
  create-only (``If-None-Match: *``): the first writer wins, a second gets ``ClaimLost``; its
  marker is uploaded only after the object it names, so a reader that trusts an output only
  through its marker never sees a half-published one (an upload cut off publishes nothing);
- a file is made current from the bucket before it is trusted (``refresh``: ``storage.read_marker``,
  a video before it is decoded), and a folder before it is listed (``pull``);
- what the run's end writes without ``atomic_write`` (manifest, outcome records, report) is
  uploaded by ``push``;
- ``work/`` (the intermediates) and ``logs/`` stay on this host's disk, never uploaded.

Credentials come from the store's own chain (for S3: environment, ``~/.aws``, instance role;
``AWS_ENDPOINT_URL`` for MinIO and other S3-compatible stores), never from a message or a file
framefleet writes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from tasks.errors import ClaimLost, DatasetError

CACHE_ENV = "FRAMEFLEET_OBJECT_CACHE"
DEFAULT_CACHE = "/var/tmp/framefleet-objects"
LOCAL_ONLY = ("work", "logs")  # top folders of a root that stay on the host that wrote them
HOST_ONLY = ("runs/live.hold",)  # files that mean something only to the host that holds them
SECRET_SUFFIXES = (".key",)  # a run's key (tasks.run.seal): it stays on the host's disk, never in the bucket
DATA_SUFFIXES = (".hdf5",)  # what ``pull`` leaves to be fetched when read, unless asked for the data
CREATE_ONLY_SUFFIXES = (".hdf5", ".hdf5.done.json")  # the dataset files and their markers (tasks.outputs.stage_io)


class BucketUnreachable(DatasetError):
    """An object-store root whose bucket does not answer, does not exist or refuses these credentials."""


@dataclass(frozen=True)
class Located:
    """Where a path of a mirror folder lives in its store: the root's URL and the key below it (posix)."""

    root: str
    key: str

    @property
    def url(self) -> str:
        return f"{self.root.rstrip('/')}/{self.key}" if self.key else self.root

    @property
    def local_only(self) -> bool:
        top = self.key.split("/", 1)[0]
        secret = top == "runs" and self.key.endswith(SECRET_SUFFIXES)
        return top in LOCAL_ONLY or self.key in HOST_ONLY or secret

    @property
    def create_only(self) -> bool:
        """Whether the key is an exactly-once output: published once, by the first writer."""
        return self.key.endswith(CREATE_ONLY_SUFFIXES)


def is_url(text: str | os.PathLike[str]) -> bool:
    scheme, sep, _ = os.fspath(text).partition("://")
    return bool(sep) and scheme.isalnum() and scheme != "file"


def cache_root() -> Path:
    """The folder that holds this host's mirrors (``FRAMEFLEET_OBJECT_CACHE``; the same on every host)."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def split_url(url: str) -> tuple[str, str, str]:
    """``scheme://bucket/prefix`` as (scheme, bucket, prefix without slashes at its ends)."""
    scheme, _, rest = url.partition("://")
    bucket, _, prefix = rest.strip("/").partition("/")
    if not bucket:
        raise BucketUnreachable(f"{url!r} names no bucket; give it as {scheme}://BUCKET/PREFIX")
    return scheme, bucket, prefix.strip("/")


def mirror_of(url: str) -> Path:
    """The folder of this host that stands for the root ``url`` (a pure function of the URL and the cache)."""
    scheme, bucket, prefix = split_url(url)
    return cache_root() / scheme / bucket / quote("/" + prefix, safe="")


def located(path: str | os.PathLike[str]) -> Located | None:
    """Where ``path`` lives in its store, or None for a path of no mirror (a local folder's)."""
    path = Path(os.path.abspath(path))
    for base in {cache_root(), cache_root().resolve()}:
        try:
            parts = path.relative_to(base).parts
        except ValueError:
            continue
        if len(parts) < 3:
            return None
        scheme, bucket, prefix = parts[0], parts[1], unquote(parts[2]).strip("/")
        root = f"{scheme}://{bucket}/{prefix}".rstrip("/")
        return Located(root, "/".join(parts[3:]))
    return None


_FILESYSTEMS: dict[tuple[int, str], Any] = {}


def filesystem(url: str) -> Any:
    """The fsspec filesystem of ``url``'s scheme, one per process (a forked worker makes its own)."""
    scheme = url.partition("://")[0]
    key = (os.getpid(), scheme)
    if key not in _FILESYSTEMS:
        import fsspec

        try:
            _FILESYSTEMS[key] = fsspec.filesystem(scheme, skip_instance_cache=True)
        except ImportError as exc:
            raise BucketUnreachable(
                f"{scheme}:// needs its fsspec package ({exc}); for s3:// install framefleet with its s3 extra "
                "(pip install 'framefleet[s3]')"
            ) from exc
    return _FILESYSTEMS[key]


def _bare(url: str) -> str:
    return url.partition("://")[2]


def publish(tmp: Path, path: Path) -> None:
    """Upload ``tmp`` as the object of ``path`` (a mirror's file; nothing for any other); raises ClaimLost when
    an exactly-once output is there already (another writer's)."""
    where = located(path)
    if where is None or where.local_only:
        return
    fs = filesystem(where.url)
    mode = "create" if where.create_only else "overwrite"
    try:
        fs.put_file(str(tmp), _bare(where.url), mode=mode)
    except (FileExistsError, OSError) as exc:
        if mode == "create" and _precondition_failed(exc):
            raise ClaimLost(f"{where.url} was published by another writer meanwhile; this output discarded") from exc
        raise
    # The copy here carries the object's time, so ``refresh`` finds it current rather than fetching it back.
    if (modified := _mtime(fs.info(_bare(where.url)))) is not None:
        os.utime(tmp, (modified, modified))


def _precondition_failed(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc} {exc.__cause__!r}"
    return isinstance(exc, FileExistsError) or "PreconditionFailed" in text or "412" in text


def refresh(path: Path) -> None:
    """Make ``path`` (a mirror's file) what its object is: fetched when missing or changed, removed when the
    object is gone; nothing for a local folder's file."""
    where = located(path)
    if where is None or where.local_only:
        return
    fs = filesystem(where.url)
    try:
        info = fs.info(_bare(where.url))
    except FileNotFoundError:
        path.unlink(missing_ok=True)
        return
    if info.get("type") == "file":
        _fetch(fs, where.url, info, path)


def _fetch(fs: Any, url: str, info: dict[str, Any], path: Path) -> None:
    """Download ``url`` to ``path`` unless the copy there is as new (written here since, or fetched or published
    with the object's time); atomic by rename."""
    modified = _mtime(info)
    try:
        if modified is None or path.stat().st_mtime >= modified:
            return
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.fetch")
    try:
        fs.get_file(_bare(url), str(tmp))
        if modified is not None:
            os.utime(tmp, (modified, modified))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _mtime(info: dict[str, Any]) -> float | None:
    stamp = info.get("LastModified") or info.get("mtime") or info.get("updated")
    if stamp is None:
        return None
    return stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp)


def objects(folder: Path) -> dict[str, dict[str, Any]]:
    """The objects under a mirror folder's prefix: key below the folder (posix) -> its info; one paged listing."""
    where = located(folder)
    if where is None:
        return {}
    fs = filesystem(where.url)
    base = _bare(where.url).rstrip("/")
    try:
        found = fs.find(base, detail=True)
    except FileNotFoundError:
        return {}
    return {name[len(base) + 1 :]: info for name, info in found.items() if info.get("type") == "file"}


def pull(folder: Path, data: bool = False) -> None:
    """Fetch into a mirror folder what the bucket holds newer under it; keep what was written here since.

    Dataset files (DATA_SUFFIXES) are fetched only with ``data``; they are otherwise fetched when read. A file
    whose object is gone stays until it is read (``refresh`` removes it then): one written here and not yet
    pushed looks the same.
    """
    where = located(folder)
    if where is None:
        return
    fs = filesystem(where.url)
    remote = objects(folder)
    for key, info in remote.items():
        if Located(where.root, _join(where.key, key)).local_only or (key.endswith(DATA_SUFFIXES) and not data):
            continue
        _fetch(fs, f"{where.url.rstrip('/')}/{key}", info, folder / key)


def push(folder: Path) -> int:
    """Upload the files of a mirror folder that the bucket lacks or holds older (never an exactly-once
    output: those are published as they are written); return how many."""
    where = located(folder)
    if where is None:
        return 0
    fs = filesystem(where.url)
    remote = objects(folder)
    sent = 0
    for path in _files(folder):
        key = path.relative_to(folder).as_posix()
        here = Located(where.root, _join(where.key, key))
        if here.local_only or here.create_only or path.name.startswith("."):
            continue
        info = remote.get(key)
        st = path.stat()
        if info is not None and info["size"] == st.st_size and (_mtime(info) or 0) >= st.st_mtime:
            continue
        fs.put_file(str(path), _bare(here.url))
        sent += 1
    return sent


def withdraw(output: Path, marker: Path, replace: bool) -> None:
    """Delete an exactly-once output published without its marker (its writer died between the two), or with
    ``replace`` (a forced redo) the marker and then the output. Call it only while holding the stage's claim."""
    where, marked = located(output), located(marker)
    if where is None or marked is None or where.local_only:
        return
    fs = filesystem(where.url)
    if replace and fs.exists(_bare(marked.url)):
        fs.rm_file(_bare(marked.url))
    if replace:
        marker.unlink(missing_ok=True)
    if fs.exists(_bare(where.url)) and not fs.exists(_bare(marked.url)):
        fs.rm_file(_bare(where.url))
        output.unlink(missing_ok=True)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}/{key}" if prefix else key


def _files(folder: Path) -> Iterator[Path]:
    if folder.is_dir():
        yield from (p for p in folder.rglob("*") if p.is_file() and not p.name.endswith((".tmp", ".fetch")))


def shown(path: Path) -> str:
    """A folder as a user named it: its URL for a mirror folder, the path otherwise."""
    where = located(path)
    return where.url if where is not None else str(path)


def listing(folder: Path) -> list[tuple[str, int]] | None:
    """The files under a mirror folder's prefix as (posix key below it, bytes), or None for a local folder."""
    if located(folder) is None:
        return None
    return [(key, int(info["size"])) for key, info in objects(folder).items()]

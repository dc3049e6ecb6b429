"""Which roots a worker serves: confined by default, so that a message cannot choose where it reads or writes.

A worker takes its roots, in this order, from:

1. its settings or environment (``dataset_root``/``output_root``, $FRAMEFLEET_DATASET_ROOT and
   $FRAMEFLEET_OUTPUT_ROOT; ``framefleet run`` sets both to its run's RAW and OUT): it serves jobs
   whose roots lie at or below them;
2. otherwise this host's list of allowed roots, a file of this user's (mode 0600) that only an
   operator on this host writes: ``framefleet enqueue`` adds its RAW and OUT pair to it, so the
   README's hand-started workers serve the datasets enqueued from their host and no other. A worker
   with neither says so at start, and refuses each job naming the fix;
3. ``--unconfined`` (or ``unconfined: true``, $FRAMEFLEET_UNCONFINED=1): the worker reads and writes
   wherever a message says. It says so loudly at start and on every job.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import stat
import sys
from pathlib import Path

from tasks.errors import PathOutsideRoot
from tasks.job import Job
from worker_config.settings import Settings

log = logging.getLogger("framefleet.worker")
FILE_NAME = "allowed-roots.jsonl"
ROOT_FIELDS = ("dataset_root", "output_root")
FIX = (
    "set FRAMEFLEET_DATASET_ROOT and FRAMEFLEET_OUTPUT_ROOT (dataset_root/output_root in the settings) for "
    "this worker, or enqueue the dataset from this host (`framefleet enqueue` allows its roots here)"
)
# Set at a worker's start (tasks.workers.worker): whether this process serves messages, and its --unconfined
# flag. A program that runs a task's body itself (a test, a bench) is not confined: no message chose its roots.
STATE = {"worker": False, "unconfined": False}


def run_env(dataset_root: Path, output_root: Path) -> dict[str, str]:
    """The environment that confines a worker to one run's RAW and OUT (``framefleet run``'s workers)."""
    return {
        "FRAMEFLEET_DATASET_ROOT": str(Path(dataset_root).resolve()),
        "FRAMEFLEET_OUTPUT_ROOT": str(Path(output_root).resolve()),
    }


def roots_file(conf: Settings) -> Path:
    """This host's list of allowed roots: ``allowed_roots_file`` or $XDG_STATE_HOME/framefleet/allowed-roots.jsonl."""
    if conf.allowed_roots_file is not None:
        return Path(conf.allowed_roots_file)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "framefleet" / FILE_NAME


def unconfined(conf: Settings) -> bool:
    return conf.unconfined or STATE["unconfined"]


def allow(conf: Settings, dataset_root: Path, output_root: Path) -> Path:
    """Add (``dataset_root``, ``output_root``) to this host's allowed roots (an operator's act); return the file."""
    path = roots_file(conf)
    if path.exists() and not allowed_pairs(path) and path.stat().st_size:
        return path  # not a file of this user's alone (allowed_pairs said so): left as it is
    pair = {"dataset_root": str(Path(dataset_root).resolve()), "output_root": str(Path(output_root).resolve())}
    if pair in allowed_pairs(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (json.dumps(pair, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)
    return path


def allowed_pairs(path: Path) -> list[dict[str, str]]:
    """The pairs of roots in ``path``; none when it is missing, or not this user's own file closed to others."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            log.warning("%s is not a file of this user's that only it may write: its roots are not allowed", path)
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return []
    pairs = []
    for line in lines:
        try:
            pair = json.loads(line)
        except ValueError:
            continue  # a line cut short
        if isinstance(pair, dict) and all(isinstance(pair.get(k), str) for k in ROOT_FIELDS):
            pairs.append({k: pair[k] for k in ROOT_FIELDS})
    return pairs


def _and_above(given: str) -> frozenset[Path]:
    """``given`` resolved and every folder above it: a root lies within ``base`` when ``base`` is one of them."""
    root = Path(given).resolve()
    return frozenset((root, *root.parents))


# The allowed roots as last read, by file: the file's lstat (its identity, size, times, owner and mode), and
# its pairs resolved. Read again when any of those changes: `framefleet enqueue` appending a pair, an
# operator editing or replacing the file. A job checks one lstat, not the parse and 2 resolves a pair.
_READ: dict[Path, tuple[tuple[int, ...], list[dict[str, Path]]]] = {}


def allowed_roots(path: Path) -> list[dict[str, Path]]:
    """The pairs of ``path`` (``allowed_pairs``) with their roots resolved, read once per version of the file."""
    version: tuple[int, ...] = ()  # no file
    try:
        st = path.lstat()
        version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)
    except FileNotFoundError:
        pass
    read = _READ.get(path)
    if read is None or read[0] != version:
        pairs = [{k: Path(v).resolve() for k, v in pair.items()} for pair in allowed_pairs(path)] if version else []
        read = _READ[path] = (version, pairs)
    return read[1]


@functools.lru_cache(maxsize=64)
def _resolved(root: str) -> Path:
    """A settings root resolved once per process: a worker's own roots do not change while it runs."""
    return Path(root).resolve()


def check(job: Job, conf: Settings) -> None:
    """Refuse a job whose roots this worker does not serve (module doc); raises PathOutsideRoot naming the field."""
    if unconfined(conf) and STATE["worker"]:
        log.warning("UNCONFINED worker: serving %r of run %r wherever its message says", job.video_id, job.run_id)
        return
    check_roots({"dataset_root": job.dataset_root, "output_root": job.output_root}, conf)


def check_roots(given: dict[str, str], conf: Settings) -> None:
    """Refuse roots (``given``: some of ROOT_FIELDS) this worker does not serve; raises PathOutsideRoot."""
    if unconfined(conf) or not STATE["worker"]:
        return
    above = {key: _and_above(value) for key, value in given.items()}
    if conf.dataset_root is not None or conf.output_root is not None:
        for key in given:
            allowed = getattr(conf, key)
            if allowed is None:
                raise PathOutsideRoot(f"job refused: {key}: this worker has no {key} set; {FIX}")
            if _resolved(str(allowed)) not in above[key]:
                raise PathOutsideRoot(
                    f"job refused: {key}: {Path(given[key]).resolve()} is outside {Path(allowed).resolve()}, the {key} "
                    f"this worker serves (set {key} in the worker's settings to change it)"
                )
        return
    path = roots_file(conf)
    if any(all(pair[k] in above[k] for k in given) for pair in allowed_roots(path)):
        return
    raise PathOutsideRoot(
        f"job refused: {', '.join(given)}: {', '.join(repr(v) for v in given.values())} not among the roots "
        f"allowed on this host ({path}); {FIX}"
    )


def describe(conf: Settings) -> str:
    """One line on what this worker serves, for its start."""
    if unconfined(conf):
        return (
            "framefleet: WARNING: this worker is UNCONFINED (--unconfined): any message that reaches its Redis "
            "chooses which files it reads, writes and deletes"
        )
    if conf.dataset_root is not None or conf.output_root is not None:
        return f"framefleet: worker confined to dataset_root {conf.dataset_root} and output_root {conf.output_root}"
    return (
        f"framefleet: WARNING: this worker has no dataset_root/output_root: it serves only the roots allowed "
        f"on this host ({roots_file(conf)}, written by `framefleet enqueue` here) and refuses other jobs; "
        f"to serve a shared dataset, {FIX.split(', or ')[0]}"
    )


UNRECORDED = (
    "framefleet: WARNING: this worker serves jobs of output folders holding no record of their run "
    "(unrecorded_runs): a message that reaches its Redis may name any folder it serves as an output folder"
)


def announce(conf: Settings) -> None:
    """Say at start what this worker serves, on stderr and in its log (a warning unless it has its roots)."""
    line = describe(conf)
    print(line, file=sys.stderr, flush=True)
    # Before Celery sets up logging (celeryd_init) a warning would reach stderr a second time (logging's
    # last resort): the log gets it only where it has a handler of its own.
    if log.hasHandlers():
        (log.info if "confined to" in line else log.warning)("%s", line.removeprefix("framefleet: "))
    if conf.unrecorded_runs:  # tasks.pipeline.admission
        print(UNRECORDED, file=sys.stderr, flush=True)
        if log.hasHandlers():
            log.warning("%s", UNRECORDED.removeprefix("framefleet: "))

"""One live run per output folder: a lock in Redis keyed by OUT's real path, and OUT/runs/live.hold, which a
run on another Redis sees.

The rule (docs/operations-runs.md): a run holds OUT from its enqueue until it ends (finished, cancelled or
lost). While its enqueuer sends, the enqueuer beats (a key with a TTL of BEAT_TTL_S, renewed by a thread);
once every video is sent the run holds OUT by itself, as long as Redis says it is running. A holder is
stale when its enqueuer is gone while sending (its process no longer exists on this host, or its beat
lapsed: killed, its run never ends by itself), when Redis no longer knows its run, or when the run ended; a
stale hold is taken over with a compare-and-set, and the run of an enqueuer that died while sending is
cancelled (what it sent stops at the flag; complete outputs stay).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from tasks import keys
from tasks.errors import DatasetError
from tasks.outputs.storage import write_text_atomic
from tasks.run import own_redis, runs
from tasks.workers.node_name import pid_alive
from worker_config.settings import redact_url
from worker_config.settings_match import start_command

BEAT_TTL_S = 15  # an enqueuer silent this long while sending is gone (a SIGKILL, a lost host)
BEAT_EVERY_S = 3.0
FILE = "live.hold"  # in OUT/runs/ (runs.latest reads only *.json there)

# Replace KEYS[1] by ARGV[2] when it holds ARGV[1] ("" for nothing); return 1, else 0.
_SWAP = """
local v = redis.call('GET', KEYS[1])
if (v == false and ARGV[1] == '') or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
  return 1
end
return 0
"""
# Delete KEYS[1] when it holds ARGV[1]; return 1, else 0.
_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class OutHeld(DatasetError):
    """Another live run holds the output folder; the message names it and how to join, watch or cancel it."""


def lock_key(out_dir: Path) -> str:
    return keys.OUT_LOCK_PREFIX + str(out_dir.resolve())


def beat_key(run_id: str) -> str:
    return keys.OUT_BEAT_PREFIX + run_id


def file_path(out_dir: Path) -> Path:
    return out_dir / runs.FOLDER / FILE


def read_file(out_dir: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(file_path(out_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _decode(raw: str | bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        return dict(json.loads(raw))
    except (ValueError, TypeError):
        return None


def why_live(r: redis.Redis, holder: dict[str, Any]) -> str | None:
    """Why ``holder``'s run still holds OUT (its enqueuer beats, or Redis says it runs), or None when stale."""
    run_id = holder["run_id"]
    if holder.get("phase") == "sending":
        if holder.get("host") == socket.gethostname() and not pid_alive(int(holder.get("pid") or 0)):
            return None  # its enqueuer, on this host, is gone: no need to wait for its beat to lapse
        return "its enqueuer is sending it" if r.exists(beat_key(run_id)) else None
    record = runs.lookup(r, run_id)
    if record is None or record.get("status", "running") != "running" or r.exists(keys.CANCELLED_PREFIX + run_id):
        return None
    return "its workers are running it"


class Hold:
    """This run's hold on OUT: beats while sending, then ``sent`` (the run holds OUT by itself) or ``release``."""

    def __init__(self, r: redis.Redis, out_dir: Path, value: dict[str, Any], ttl_s: int) -> None:
        self.r, self.out_dir, self.value, self.ttl_s = r, out_dir, value, ttl_s
        self.raw = json.dumps(value, sort_keys=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="framefleet-out-hold", daemon=True)
        self.r.set(beat_key(value["run_id"]), "1", ex=BEAT_TTL_S)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_EVERY_S):
            # A missed beat is tried again next time; a Redis away past the TTL lets another run take OUT.
            with contextlib.suppress(redis.RedisError):
                self.r.set(beat_key(self.value["run_id"]), "1", ex=BEAT_TTL_S)

    def _stop_beating(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=BEAT_EVERY_S + 1)

    def sent(self) -> None:
        """Every video is sent: the run holds OUT by itself until it ends."""
        self._stop_beating()
        value = {**self.value, "phase": "running"}
        raw = json.dumps(value, sort_keys=True)
        if self.r.eval(_SWAP, 1, lock_key(self.out_dir), self.raw, raw, self.ttl_s):
            self.raw, self.value = raw, value
            write_text_atomic(file_path(self.out_dir), raw)
        self.r.delete(beat_key(value["run_id"]))

    def abandon(self) -> None:
        """The enqueuer stops while sending: stop beating at once, so the next run takes OUT over now."""
        self._stop_beating()
        with contextlib.suppress(redis.RedisError):  # else the beat lapses in BEAT_TTL_S
            self.r.delete(beat_key(self.value["run_id"]))

    def release(self) -> None:
        """The run ended before it was sent in full (cancelled while sending): OUT is free."""
        self._stop_beating()
        release(self.r, self.out_dir, self.value["run_id"])


def release(r: redis.Redis, out_dir: Path, run_id: str) -> None:
    """Free OUT when ``run_id`` holds it (the run ended); a hold of another run stays."""
    found = r.get(lock_key(out_dir))
    held = _decode(found)
    if held is not None and held.get("run_id") == run_id:
        r.eval(_DROP, 1, lock_key(out_dir), found)
    on_file = read_file(out_dir)
    if on_file is not None and on_file.get("run_id") == run_id:
        file_path(out_dir).unlink(missing_ok=True)
    r.delete(beat_key(run_id))


def refusal(
    out_dir: Path, holder: dict[str, Any], why: str, redis_shown: str, record: dict[str, Any] | None = None
) -> str:
    """The refusal of a second run on ``out_dir``: the live run, then the commands that join, watch or cancel it
    (``record``: the holder's run record, for the settings a joining worker needs)."""
    run_id = holder["run_id"]
    began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started") or 0)))
    where, which = f"REDIS_URL={redis_shown} ", run_id
    if (kept := own_redis.kept(out_dir)) is not None and redact_url(kept) == redis_shown:
        where, which = "", f"--out {out_dir}"  # a `framefleet run`'s private Redis: OUT finds it
    if record is not None:
        tag = str((record.get("stage_settings") or {}).get("sha256", ""))[:8] or run_id[-6:]
        worker = start_command(
            "cpu", record.get("config"), record.get("settings_env") or {}, f"join-{tag}", redis_shown
        )
        join = f"`{worker}` (-Q gpuN -P solo for a GPU)"
    else:
        join = f"start workers with its settings on Redis {redis_shown}"
    return (
        f"{out_dir} is held by run {run_id} (started {began} by pid {holder.get('pid')} on {holder.get('host')}, "
        f"Redis {redis_shown}; {why}); one live run per output folder, so nothing was sent.\n"
        f"  join it:   {join}\n"
        f"  watch it:  {where}framefleet status --watch {which}\n"
        f"  cancel it: {where}framefleet cancel {which}   (complete outputs stay; then --continue finishes it)"
    )


def held_elsewhere(out_dir: Path, ours: str | None) -> tuple[dict[str, Any], str, str] | None:
    """OUT/runs/live.hold's run when it may still be live on its Redis: (holder, why, its Redis as shown); None
    when there is none, when it was started on ``ours`` (that Redis's lock decides), or when its Redis says
    it is over or is gone. ``ours`` None: no Redis of this command's yet, so ask the holder's whatever it is."""
    holder = read_file(out_dir)
    if holder is None or (ours is not None and holder.get("redis") == redact_url(ours)):
        return None
    shown = str(holder.get("redis"))
    if (runs.read(out_dir, holder["run_id"]) or {}).get("status", "running") != "running":
        return None
    url = shown
    if "***" in shown:  # its password is not written down here, unless it is a `framefleet run`'s private Redis
        kept = own_redis.kept(out_dir)
        if kept is None or redact_url(kept) != shown:
            gone = f"its Redis cannot be asked from here; if that Redis is gone for good, delete {file_path(out_dir)}"
            return holder, gone, shown
        url = kept
    try:
        theirs = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)
        why = why_live(theirs, holder)
    except redis.ConnectionError:
        return None  # its Redis is gone (a `framefleet run`'s private one): so is its run
    except redis.RedisError as exc:
        why = f"its Redis answers with an error ({exc})"
    return (holder, why, shown) if why else None


def refuse_if_live(r: redis.Redis, out_dir: Path, redis_url: str) -> None:
    """Raise OutHeld, as ``acquire`` would, when a live run holds ``out_dir`` (in ``r``'s lock or, for a run on
    another Redis, in OUT's hold file); nothing when the folder is free or its holder is stale."""
    holder = _decode(r.get(lock_key(out_dir)))
    why = why_live(r, holder) if holder is not None else ""
    if holder is not None and why:
        raise OutHeld(refusal(out_dir, holder, why, redact_url(redis_url), runs.lookup(r, holder["run_id"])))
    other = held_elsewhere(out_dir, redis_url)
    if other is not None:
        raise OutHeld(refusal(out_dir, *other))


def acquire(
    r: redis.Redis,
    out_dir: Path,
    run_id: str,
    redis_url: str,
    ttl_s: int,
    end_stale: Callable[[dict[str, Any]], None],
) -> Hold:
    """Hold ``out_dir`` for ``run_id`` (and start beating); a stale hold is taken over, ``end_stale`` called
    with it first when its run's enqueuer died while sending. Raises OutHeld naming the live holder."""
    other = held_elsewhere(out_dir, redis_url)
    if other is not None:
        raise OutHeld(refusal(out_dir, *other))
    value = {
        "run_id": run_id,
        "phase": "sending",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": round(time.time(), 3),
        "redis": redact_url(redis_url),
        "out": str(out_dir.resolve()),
    }
    raw = json.dumps(value, sort_keys=True)
    # Beating before the hold exists: another enqueue that reads the hold at once finds it live.
    r.set(beat_key(run_id), "1", ex=BEAT_TTL_S)
    while True:
        found = r.get(lock_key(out_dir))
        holder = _decode(found)
        if holder is not None:
            why = why_live(r, holder)
            if why:
                r.delete(beat_key(run_id))
                shown = redact_url(redis_url)
                raise OutHeld(refusal(out_dir, holder, why, shown, runs.lookup(r, holder["run_id"])))
        if r.eval(_SWAP, 1, lock_key(out_dir), found or "", raw, ttl_s):
            break  # else another enqueue changed the hold between the read and the swap: look again
    if holder is not None and holder.get("phase") == "sending":
        end_stale(holder)
    hold = Hold(r, out_dir, value, ttl_s)
    file_path(out_dir).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(file_path(out_dir), raw)
    return hold

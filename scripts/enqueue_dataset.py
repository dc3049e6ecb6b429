#!/usr/bin/env python3
"""Enqueue a folder of videos as one dataset run and show its progress until the statistics exist.

    python scripts/enqueue_dataset.py RAW_DIR --out OUT [--limit N] [--gpus 0,2] [--no-wait]
                                      [--metadata FILE] [--require-text]

Text for each video's root/text (and the noun the masks stage prompts with) comes from
RAW_DIR/metadata.csv, or --metadata FILE: columns clip_id, noun, text, where clip_id is the
video's path under RAW_DIR without its extension, or y2r's index of it in sorted order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
import yaml  # noqa: E402

from scripts import _cli  # noqa: E402
from tasks import quarantine, registry, stall
from tasks.celery_app import settings
from tasks.cli.common import parse_gpus
from tasks.dataset import (
    DatasetError,
    build_chord,
    check_folders,
    find_videos,
    incomplete,
    new_run_id,
    write_manifest,
)
from tasks.metadata import MetadataError, texts_for
from tasks.redis_client import get_redis
from tasks.storage import write_text_atomic
from worker_config.settings import Settings, redact_url, resolved_dict


def check_redis(conf: Settings) -> str | None:
    """Return why Redis cannot be reached (with how to fix it), or None when it answers."""
    try:
        get_redis(conf.redis_url).ping()
        return None
    except redis.RedisError as exc:
        return (
            f"cannot reach Redis at {redact_url(conf.redis_url)} ({exc}). Start one "
            "(`redis-server --port 6379 --daemonize yes`), or point REDIS_URL (or redis_url in "
            "--config) at the Redis your workers use; scripts/run_local.py starts its own"
        )


def enqueue(conf: Settings, raw_dir: Path, out_dir: Path, limit: int | None = None,
            gpus: list[int] | None = None, resume: bool = False, force: bool = False,
            retry_quarantined: bool = False, metadata: Path | None = None,
            require_text: bool = False) -> dict[str, Any]:
    """Send the run's chord; return {run_id, callback_id, videos}. Raises DatasetError or MetadataError."""
    every_video = find_videos(raw_dir)
    videos = every_video[: limit or None]
    check_folders(raw_dir, out_dir, resume or retry_quarantined, force)
    # y2r's numeric clip ids count every video, so the limit applies after reading the file.
    texts = texts_for(raw_dir, every_video, metadata, require_text, selected=videos)
    run_id = new_run_id()
    entries = write_manifest(raw_dir, out_dir, videos, run_id, texts)
    if retry_quarantined:
        held = quarantine.read(out_dir)
        if not held:
            raise DatasetError(f"no quarantined videos in {out_dir / quarantine.FILE}; nothing to retry")
        entries, resume = [e for e in entries if e["video_id"] in held], True
    write_text_atomic(out_dir / "settings.resolved.yaml",
                      yaml.safe_dump(resolved_dict(conf), sort_keys=True))
    todo = entries if force or not resume else incomplete(entries, out_dir)
    canvas, run = build_chord(todo, raw_dir, out_dir, run_id, gpus=gpus, force=force,
                              already_complete=len(entries) - len(todo))
    callback_id = canvas.apply_async().id
    release_result_subscriptions()
    record = {"run_id": run_id, "callback_id": callback_id, "videos": len(todo),
              "already_complete": len(entries) - len(todo),
              "gpus": gpus, "started": run["started"]}
    write_text_atomic(out_dir / "runs" / f"{run_id}.json", json.dumps(record, indent=1))
    return record


def release_result_subscriptions() -> None:
    """Drop the result subscriptions Celery opened while sending (one per chain) while Redis is up.

    The enqueuer polls the callback's state instead; left alone, these would be unsubscribed
    at interpreter exit, after a private Redis is gone.
    """
    from tasks import app

    pending = getattr(app.backend, "_pending_results", None)
    for mapping in pending or ():
        for waiters in list(mapping.values()):
            for result in list(waiters.values()):
                app.backend.remove_pending_result(result)


def add_metadata_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --metadata and --require-text (shared with run_local)."""
    parser.add_argument("--metadata", type=Path, metavar="FILE",
                        help="CSV with columns clip_id, noun, text (default: RAW_DIR/metadata.csv if present)")
    parser.add_argument("--require-text", action="store_true",
                        help="refuse to start unless every video has a non-empty text in the metadata")


def render(counts: dict[str, int], total: int, started: float) -> str:
    finished = counts.get("videos.done", 0) + counts.get("videos.failed", 0)
    width = 24
    filled = int(width * finished / total) if total else width
    stages = " ".join(f"{s} {counts.get(s + '.done', 0)}" for s in settings().enabled_stages())
    elapsed = time.time() - started
    eta = "--:--"
    if 0 < finished < total:
        eta = time.strftime("%H:%M:%S", time.gmtime(elapsed / finished * (total - finished)))
    return (f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{total} videos | {stages} | "
            f"failed {counts.get('videos.failed', 0)} | {elapsed:.0f}s elapsed, ETA {eta}")


LOSS_CHECK_S = 10.0  # how often the enqueuer looks for the run's messages; two misses in a row: lost


def wait_for(conf: Settings, record: dict[str, Any], poll_s: float = 0.5) -> dict[str, Any]:
    """Show progress until the chord callback has run; return its summary.

    Raises stall.RunLost when no message of the run is left in Redis (seen twice, LOSS_CHECK_S apart).
    """
    from tasks import app, progress

    tty = sys.stdout.isatty()
    last, last_print = "", 0.0
    counts: dict[str, int] = {}
    changed, reported = time.monotonic(), 0.0
    checked, misses = time.monotonic(), 0
    while True:
        try:
            now_counts = progress.read(get_redis(conf.redis_url), record["run_id"])
            if now_counts != counts:
                counts, changed = now_counts, time.monotonic()
            line = render(counts, record["videos"], record["started"])
            stalled = time.monotonic() - changed
            if stalled > conf.stall_after_s and time.monotonic() - reported > conf.stall_after_s:
                reported = time.monotonic()
                why = stall.diagnose(get_redis(conf.redis_url), get_redis(conf.broker), conf)
                print(f"\nno task finished for {stalled:.0f} s: " + ("; ".join(why) or _no_cause(conf)),
                      file=sys.stderr, flush=True)
            if time.monotonic() - checked > LOSS_CHECK_S:
                checked = time.monotonic()
                found = stall.run_messages(get_redis(conf.redis_url), get_redis(conf.broker), conf,
                                           record["run_id"], record["callback_id"])
                misses = 0 if found else misses + 1
            # Polled without an AsyncResult: its pub/sub outlives a private Redis at teardown.
            meta = app.backend.get_task_meta(record["callback_id"])
            ready = meta["status"] in ("SUCCESS", "FAILURE")
            if misses >= 2 and not ready:
                raise stall.RunLost(f"the messages of run {record['run_id']} are gone from Redis (it restarted "
                                    "without persistence, or was flushed)")
        except redis.RedisError as exc:
            line, ready = f"Redis unreachable ({type(exc).__name__}); retrying…", False
        if tty:
            print("\r" + line, end="", flush=True)
        elif line != last and (time.time() - last_print > 5 or ready):
            print(line, flush=True)
            last_print = time.time()
        last = line
        if ready:
            if tty:
                print()
            if meta["status"] == "FAILURE":
                raise RuntimeError(f"the statistics callback failed: {meta['result']}")
            return meta["result"]
        time.sleep(poll_s)


def _no_cause(conf: Settings) -> str:
    busy = [w for w in registry.live_workers(get_redis(conf.redis_url)) if w.get("busy")]
    if busy:
        return f"{len(busy)} worker(s) busy with long tasks: " + ", ".join(
            f"{w['hostname']} ({(w.get('current') or {}).get('task', '?')})" for w in busy)
    return "no worker is busy and no task waits"


def report(summary: dict[str, Any], out_dir: Path) -> int:
    print(f"done: {summary['done']} of {summary['videos']} videos; statistics over "
          f"{summary['statistics_videos']} videos in {out_dir / 'normalization_stats.yaml'}")
    print(f"summary: {out_dir / 'run_summary.json'}")
    if summary["failed"]:
        print(f"failed: {len(summary['failed'])} videos:")
        for f in summary["failed"]:
            print(f"  {f['video']} ({f['video_id']}): {f['stage']}: {f['error_class']}: {f['reason']}")
        print(f"quarantined: {out_dir / quarantine.FILE}; after fixing, "
              "enqueue them again with --retry-quarantined")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw_dir", type=Path, metavar="RAW_DIR")
    parser.add_argument("--out", type=Path, required=True, metavar="OUT")
    parser.add_argument("--limit", type=int, help="only the first N videos (sorted by path)")
    parser.add_argument("--gpus", type=parse_gpus, help="GPU indices to use, e.g. 0,2 (default: all)")
    parser.add_argument("--no-wait", action="store_true", help="print the run id and return at once")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--continue", dest="resume", action="store_true",
                      help="finish an earlier run in OUT, skipping complete outputs")
    mode.add_argument("--force", action="store_true", help="redo every video in OUT")
    mode.add_argument("--retry-quarantined", action="store_true",
                      help="enqueue again only the videos listed in OUT/quarantine.jsonl")
    add_metadata_arguments(parser)
    parser.add_argument("--resume-on-loss", action="store_true",
                        help="if the run's messages vanish from Redis, enqueue the unfinished videos again "
                             "(as --continue would) instead of exiting with status 3")
    _cli.add_config_argument(parser)
    args = parser.parse_args(argv)
    conf = _cli.settings_from(args)
    if (why := check_redis(conf)) is not None:
        return _cli.fail(why)
    try:
        record = enqueue(conf, args.raw_dir, args.out, args.limit, args.gpus, args.resume, args.force,
                         args.retry_quarantined, args.metadata, args.require_text)
    except (DatasetError, MetadataError) as exc:
        return _cli.fail(str(exc))
    skipped = f" ({record['already_complete']} already complete)" if record["already_complete"] else ""
    print(f"run {record['run_id']}: {record['videos']} videos enqueued{skipped}; outputs in {args.out}",
          flush=True)
    if args.no_wait:
        print(f"not waiting; the run record is {args.out / 'runs' / (record['run_id'] + '.json')}")
        return 0
    try:
        while True:
            try:
                return report(wait_for(conf, record), args.out)
            except stall.RunLost as exc:
                if not args.resume_on_loss:
                    return _cli.fail(f"{exc}. Complete outputs are kept: `python scripts/enqueue_dataset.py "
                                     f"{args.raw_dir} --out {args.out} --continue` finishes the run "
                                     "(or pass --resume-on-loss to do it by itself)", code=3)
                record = enqueue(conf, args.raw_dir, args.out, args.limit, args.gpus, resume=True,
                                 metadata=args.metadata, require_text=args.require_text)
                print(f"{exc}; enqueued the {record['videos']} unfinished videos again as run "
                      f"{record['run_id']}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"\nstopped watching; run {record['run_id']} goes on in the workers")
        return 130


if __name__ == "__main__":
    sys.exit(main())

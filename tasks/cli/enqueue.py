"""Send a folder of videos to the running workers as one dataset run, and follow it until its statistics exist.

    framefleet enqueue RAW_DIR --out OUT [--limit N] [--gpus 0,2] [--no-wait] [--window N] [--wait-for-workers]
                       [--continue [--add] | --force | --retry-quarantined] [--intermediates keep|drop]
                       [--metadata FILE] [--require-text]

Text for each video's root/text (and the noun the masks stage prompts with) comes from
RAW_DIR/metadata.csv, or --metadata FILE: columns clip_id, noun, text, where clip_id is the
video's path under RAW_DIR without its extension, or y2r's index of it in sorted order.

Only --window videos are sent at once (default: 4 per live worker, at least 32); the others wait
in Redis, and each video that finishes sends the next, so the run goes on without this process.

The run's stage settings (backend and parameters of each stage, and their hash) are recorded with
it and every stage runs only on a worker with those settings. A run whose stages live workers host,
none with its settings, is refused before anything is sent, naming per stage what differs and the
command that starts a matching worker; --wait-for-workers enqueues it anyway.

Ctrl-C stops watching, not the run: `framefleet status --watch RUN` follows it again and
`framefleet cancel RUN` stops it. Exit status 0 when every video is done; 1 when some failed
(they are listed and quarantined); 2 on bad input; 3 when the run's messages vanished from Redis;
4 when the run was cancelled; 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from celery.utils import uuid

from tasks.cli import common, watch
from tasks.observe import stall
from tasks.outputs import buckets, intermediates, remote
from tasks.outputs.storage import write_text_atomic
from tasks.records import lineage, outcome_files, quarantine
from tasks.redis_client import get_redis
from tasks.run import cancel, completion, hold, runs, seal, settings_check
from tasks.run.dataset import (
    Completed,
    DatasetError,
    ManifestRun,
    check_folders,
    first_video,
    new_run_id,
    run_job,
    video_id_of,
)
from tasks.run.metadata import DEFAULT_NAME, MetadataError, texts_for
from tasks.run.send import RunSender
from tasks.statistics import sums
from tasks.workers import confinement, registry
from worker_config.settings import Settings, resolved_dict

CANCEL_CHECK_EVERY = 4096  # videos walked between two looks at the run's cancel flag


def enqueue(
    conf: Settings,
    raw_dir: Path,
    out_dir: Path,
    limit: int | None = None,
    gpus: list[int] | None = None,
    resume: bool = False,
    force: bool = False,
    retry_quarantined: bool = False,
    add: bool = False,
    keep: str = intermediates.DEFAULT,
    metadata: Path | None = None,
    require_text: bool = False,
    window: int | None = None,
    mixed: bool = False,
    wait_for_workers: bool = False,
) -> dict[str, Any]:
    """Send the run as its folder is walked: its first ``window`` videos' chains at once, the others held in
    Redis (tasks.run.send, tasks.run.pending), the manifest written as it goes (tasks.records.manifest); return
    its record (run_id, callback_id, videos, window, ...) once every video is sent or held.

    Memory stays flat whatever the folder's size (one folder's names at a time), except with a metadata
    file (y2r's numeric clip ids index the list of every video: the folder is listed first) and, for
    ``resume``, each complete output's recorded size and time (tasks.run.dataset.Completed). Killed
    mid-way, the run never ends by itself (its size is not recorded) and the earlier manifest stays;
    what was sent finishes, and ``resume`` sends the rest.

    ``window`` None: the settings' ``enqueue_window``, or when that is 0, 4 per live worker (at least 32).
    ``mixed``: add to a folder made with other backends or settings on purpose (else SettingsChanged).
    The run's stage settings are recorded with it; when live workers host a stage, none under the run's
    settings, the run is refused (WorkersDiffer) unless ``wait_for_workers``: then the record's
    ``settings_warnings`` say what differs.
    Raises DatasetError (SettingsChanged and WorkersDiffer among them) or MetadataError.
    """
    stream = first_video(raw_dir)  # a missing or empty folder is refused before anything else
    r = get_redis(conf.redis_url)
    # A live run's folder is refused naming that run, before its manifest would be refused as an earlier run's.
    hold.refuse_if_live(r, out_dir, conf.redis_url)
    check_folders(raw_dir, out_dir, resume or retry_quarantined, force, add)
    # Enqueuing from this host allows its roots to this host's workers without roots of their own.
    confinement.allow(conf, raw_dir, out_dir)
    if not force:
        for line in lineage.check_same(out_dir, conf, mixed):
            print(f"framefleet: warning: {line}", file=sys.stderr, flush=True)
    ran_with = settings_check.run_settings(conf)
    differ = settings_check.check(r, conf, ran_with, wait_for_workers)
    texts: dict[str, Any] = {}
    if metadata is not None or require_text or (raw_dir / DEFAULT_NAME).is_file():
        # y2r's numeric clip ids index the sorted list of every video, and a missing text is refused before
        # anything is sent: with a metadata file (itself a row per video) the folder is listed first.
        every = list(stream)
        paths = [raw_dir / v.path for v in every]
        texts = texts_for(raw_dir, paths, metadata, require_text, selected=paths[: limit or None])
        stream = iter(every)
    if limit:
        stream = itertools.islice(stream, limit)
    held = None
    if retry_quarantined:
        held = quarantine.read(out_dir)
        if not held:
            raise DatasetError(f"no quarantined videos in {out_dir / quarantine.FILE}; nothing to retry")
        resume = True
    run_id = new_run_id()
    out_hold = hold.acquire(
        r, out_dir, run_id, conf.redis_url, conf.result_expires_s, lambda stale: end_stale(conf, out_dir, stale, run_id)
    )
    made_with = lineage.current_set(conf, run_id)
    for lost, videos in outcome_files.adopt_lost(out_dir, lambda run: runs.lookup(r, run) is not None):
        print(
            f"framefleet: run {lost} never ended (Redis no longer holds it): what it recorded of its {videos} "
            "finished video(s) goes into the manifest",
            file=sys.stderr,
            flush=True,
        )
    sender: RunSender | None = None
    try:
        listing = ManifestRun(raw_dir, out_dir, run_id, texts, made_with, redo=force and not limit)
    except BaseException:
        out_hold.release()
        raise
    try:
        if listing.others:  # --add beside other folders: a clash of paths is refused before anything is sent
            for found in first_video(raw_dir):
                listing.check(video_id_of(found.path), found.path)
        write_text_atomic(out_dir / "settings.resolved.yaml", yaml.safe_dump(resolved_dict(conf), sort_keys=True))
        check = Completed(out_dir, r) if resume and not force else None
        shared = run_job(raw_dir, out_dir, run_id, gpus=gpus, force=force, intermediates=keep)
        width = window or conf.enqueue_window or completion.auto_window(len(registry.live_workers(r)))
        record = {
            "run_id": run_id,
            "videos": None,  # known once the folder is walked (tasks.run.completion.listed)
            "already_complete": None,
            "gpus": gpus,
            "started": time.time(),
            "raw_dir": str(raw_dir.resolve()),
            "output_root": str(out_dir.resolve()),
            "intermediates": keep,
            "window": width,
            "status": "running",
            **ran_with,  # each stage's settings and hash, that every stage task runs under
            "settings_warnings": differ,
            # The running sums' merged marks are sharded by a count fixed now: a video may reach its h5 stage
            # before the folder is walked and the run's size known (tasks.statistics.sums).
            "shards": sums.shard_count(limit or len(held or {})) if limit or held else sums.MAX_SHARDS,
        }
        # The record exists before the first task can finish, so cancel and status find the run at once,
        # and so do the tasks that count the run's videos.
        record["callback_id"] = uuid()
        # The run's key, then its record, on disk before anything is sent: what workers take for this run's
        # jobs comes from them (tasks.pipeline.admission), never from Redis.
        key = seal.create(out_dir, run_id)
        runs.write(out_dir, record)
        runs.publish(r, record, conf.result_expires_s)
        sender = RunSender(r, shared, width, conf.result_expires_s, key)
        complete, stopped = 0, False
        for n, found in enumerate(stream, 1):
            if n % CANCEL_CHECK_EVERY == 0 and cancel.is_cancelled(r, run_id):
                stopped = True  # `framefleet cancel` dropped what was held: hold no more
                break
            entry = listing.entry(found)
            if held is not None and entry["video_id"] not in held:
                continue
            if check is not None and check.done(entry["video_id"]):
                complete += 1
                continue
            sender.add(entry)
        sender.close()
    except BaseException:
        listing.abort()  # the earlier manifest stays; what was sent runs, and --continue sends the rest
        # Nothing sent: OUT is free. Else the next enqueue into OUT takes it over at once and cancels this run.
        if sender is None or not sender.count:
            out_hold.release()
        else:
            out_hold.abandon()
        raise
    listing.commit()
    record.update(videos=sender.count, already_complete=complete)
    if stopped or cancel.is_cancelled(r, run_id):
        completion.drop_pending(r, run_id)
        runs.update(out_dir, run_id, videos=sender.count, already_complete=complete)
        out_hold.release()
    else:
        runs.write(out_dir, record)
        out_hold.sent()  # the run holds OUT by itself now, until it ends
        completion.listed(r, record, conf.result_expires_s)  # the run's size: the last video to finish ends it
    release_result_subscriptions()
    return record


def end_stale(conf: Settings, out_dir: Path, stale: dict[str, Any], taker: str) -> None:
    """Cancel the run whose enqueuer died while sending it (``stale``: its hold on OUT), as ``taker`` takes OUT
    over: what it sent stops at the flag; its complete outputs stay, and --continue skips them."""
    from tasks.cli.cancel import cancel_run

    run_id = stale["run_id"]
    record = runs.lookup(get_redis(conf.redis_url), run_id) or runs.read(out_dir, run_id) or {"run_id": run_id}
    note = (
        f"its enqueuer (pid {stale.get('pid')} on {stale.get('host')}) stopped while sending it; "
        f"run {taker} took {out_dir} over"
    )
    cancel_run(conf, record, out_dir, note)
    print(f"framefleet: warning: run {run_id} cancelled: {note}", file=sys.stderr, flush=True)


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


def gpu_warnings(conf: Settings, gpus: list[int] | None) -> list[str]:
    """One line per GPU named by ``--gpus`` that no live worker serves: its tasks would wait there."""
    if not gpus:
        return []
    served = {w.get("gpu") for w in registry.live_workers(get_redis(conf.redis_url))}
    live = ", ".join(f"gpu{g}" for g in sorted(g for g in served if g is not None)) or "none"
    return [
        f"--gpus names GPU {g}, but no live worker serves {conf.gpu_queue(g)} (live GPU workers: {live}); "
        f"tasks routed there wait until one starts: `celery -A tasks worker -Q {conf.gpu_queue(g)}`"
        for g in gpus
        if g not in served
    ]


def waiting_for_settings(record: dict[str, Any]) -> list[str]:
    """The lines saying that the run waits for workers with its settings (enqueued with --wait-for-workers)."""
    lines = record.get("settings_warnings") or []
    if not lines:
        return []
    return ["no live worker runs this run's settings yet; its tasks wait for one:", *(f"  {x}" for x in lines)]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `framefleet enqueue` and `framefleet run` share: what to run and into which folder."""
    parser.add_argument(
        "raw_dir", type=buckets.root_arg, metavar="RAW_DIR", help="the folder of raw videos (any depth)"
    )
    parser.add_argument("--out", type=buckets.root_arg, required=True, metavar="OUT", help="the output folder")
    parser.add_argument("--limit", type=common.positive_int, metavar="N", help="only the first N videos (by path)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--continue", dest="resume", action="store_true", help="finish an earlier run in OUT, skipping complete outputs"
    )
    mode.add_argument("--force", action="store_true", help="redo every video in OUT")
    parser.add_argument(
        "--add",
        action="store_true",
        help="with --continue or --force: add RAW_DIR's videos to an OUT made from another folder",
    )
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="with --continue or --add: add videos made with other backends or settings than the folder's on "
        "purpose (without it such a run is refused, naming the difference)",
    )
    parser.add_argument(
        "--intermediates",
        choices=intermediates.MODES,
        default=intermediates.DEFAULT,
        help="keep the stages' files in OUT/work/ (an unfinished video resumes where it stopped), or drop "
        "each video's once its HDF5 file is complete (about 0.6 GB per minute of video)",
    )
    parser.add_argument(
        "--metadata",
        type=Path,
        metavar="FILE",
        help="CSV with columns clip_id, noun, text (default: RAW_DIR/metadata.csv if present)",
    )
    parser.add_argument(
        "--window",
        type=common.positive_int,
        metavar="N",
        help="videos in flight at once; each one that finishes sends the next (default: the settings' "
        "enqueue_window, or 4 per live worker and at least 32)",
    )
    parser.add_argument(
        "--require-text",
        action="store_true",
        help="refuse to start unless every video has a non-empty text in the metadata",
    )


def check_run_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.add and not (args.resume or args.force):
        parser.error("--add goes with --continue or --force (it adds videos to an earlier run's folder)")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=common.HelpFormatter)
    add_run_arguments(parser)
    parser.add_argument("--gpus", type=common.parse_gpus, help="GPU indices to use, e.g. 0,2 (default: all)")
    parser.add_argument("--no-wait", action="store_true", help="print the run id and return at once")
    parser.add_argument(
        "--resume-on-loss",
        action="store_true",
        help="kept for old scripts: what it did is the default now (a video whose message vanished is sent "
        "again by the workers' sweep; a run Redis lost altogether is enqueued again as --continue would)",
    )
    parser.add_argument(
        "--wait-for-workers",
        action="store_true",
        help="enqueue even when no live worker runs the run's stage settings (they wait for one that does); "
        "without it such a run is refused, naming what differs",
    )
    parser.add_argument(
        "--retry-quarantined", action="store_true", help="enqueue again only the videos listed in OUT/quarantine.jsonl"
    )
    common.add_config_argument(parser)
    args = parser.parse_args(argv)
    check_run_arguments(parser, args)
    if args.retry_quarantined and (args.resume or args.force):
        parser.error("--retry-quarantined goes alone (it continues the run for the quarantined videos)")
    conf = common.settings_from(args)
    common.print_backends(conf)
    if (why := common.check_redis(conf)) is not None:
        return common.fail(why)
    try:
        record = enqueue(
            conf,
            args.raw_dir,
            args.out,
            args.limit,
            args.gpus,
            args.resume,
            args.force,
            args.retry_quarantined,
            args.add,
            args.intermediates,
            args.metadata,
            args.require_text,
            args.window,
            args.mixed,
            args.wait_for_workers,
        )
    except (DatasetError, MetadataError) as exc:
        return common.fail(str(exc))
    except Exception as exc:  # Redis full or read-only: a clear stop; anything else is raised again
        return common.stop_if_redis_refused(exc, args.raw_dir, args.out)
    except KeyboardInterrupt:
        return common.fail(
            f"interrupted while sending the run; `framefleet cancel --out {args.out}` stops what was "
            "sent, and --continue sends it again",
            code=130,
        )
    remote.push(args.out)  # an object-store OUT: the manifest and the run's records, before any video ends
    try:
        for line in gpu_warnings(conf, args.gpus) + waiting_for_settings(record):
            print(f"framefleet: warning: {line}", file=sys.stderr, flush=True)
        skipped = f" ({record['already_complete']} already complete)" if record["already_complete"] else ""
        print(
            f"run {record['run_id']}: {common.plural(record['videos'], 'video')} enqueued{skipped}; "
            f"outputs in {remote.shown(args.out)}",
            flush=True,
        )
        if args.no_wait:
            print(
                f"not waiting; `framefleet status --watch {record['run_id']}` follows it, "
                f"`framefleet cancel {record['run_id']}` stops it"
            )
            return 0
        return follow(conf, record, args.out, resend=resender(conf, args))
    except KeyboardInterrupt:  # before following began
        watch.detached(record, args.out)
        return 130
    except Exception as exc:
        return common.stop_if_redis_refused(exc, args.raw_dir, args.out)


def resender(conf: Settings, args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    """What enqueues the unfinished videos of the run ``args`` sent again, as --continue would."""

    def resend() -> dict[str, Any]:
        return enqueue(
            conf,
            args.raw_dir,
            args.out,
            args.limit,
            args.gpus,
            resume=True,
            add=args.add,
            keep=args.intermediates,
            metadata=args.metadata,
            require_text=args.require_text,
            window=args.window,
            mixed=args.mixed,
            wait_for_workers=True,  # the run was accepted once; its workers may be restarting
        )

    return resend


def follow(
    conf: Settings,
    record: dict[str, Any],
    out: Path,
    detachable: bool = True,
    resend: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """Follow the run to its end and print how it ended; Ctrl-C detaches (when the run goes on
    without this process: ``detachable``, else KeyboardInterrupt propagates). Returns the exit status.

    When Redis loses the run altogether (restarted empty, flushed), ``resend`` (if given) enqueues its
    unfinished videos again and following goes on with the new run; without it the exit status is 3.
    """
    while True:
        try:
            return watch.report(watch.wait_for(conf, record), out)
        except cancel.RunCancelled:
            return watch.cancelled(record, out)
        except stall.RunLost as exc:
            runs.update(out, record["run_id"], status="lost", lost=time.time())
            if resend is None:
                return common.fail(
                    f"{exc}. Complete outputs are kept: `framefleet enqueue {record['raw_dir']} --out {out} "
                    "--continue` finishes the run",
                    code=3,
                )
            record = resend()
            print(
                f"{exc}; enqueued the {common.plural(record['videos'], 'unfinished video')} again as run "
                f"{record['run_id']}",
                file=sys.stderr,
                flush=True,
            )
        except KeyboardInterrupt:
            if not detachable:
                raise
            watch.detached(record, out)
            return 130


if __name__ == "__main__":
    sys.exit(main())

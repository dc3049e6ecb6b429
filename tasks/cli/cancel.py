"""Cancel a run: its waiting tasks are revoked, running ones stop at their next progress check.

    framefleet cancel RUN | --out OUT [--config FILE]

Every complete output stays valid (outputs are written atomically), so `framefleet run` or
`framefleet enqueue` with --continue finishes the rest later. The run's record
(OUT/runs/<run>.json) says it was cancelled. Exit status 0; 2 when the run or Redis cannot be found.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import redis

from tasks import keys
from tasks.cli import common
from tasks.observe import stall
from tasks.outputs import buckets
from tasks.redis_client import get_redis
from tasks.run import cancel, completion, hold, runs
from tasks.statistics import sums
from tasks.workers import registry
from worker_config.settings import Settings


def _let_go(r: redis.Redis, out: Path, run_id: str, keep_s: int, shards: int) -> None:
    """Keep the cancelled run's stage log in OUT/runs/ and let its per-video Redis keys go (no callback
    will read them; its tasks stop at the flag). Says so when it cannot; the keys then expire with their TTLs."""
    try:
        runs.save_stage_log(r, out, run_id)
        pipe = r.pipeline()
        completion.let_go(pipe, run_id, keep_s, shards=shards)
        pipe.execute()
    except (OSError, redis.RedisError) as exc:
        print(f"framefleet: the run's Redis keys were left to expire ({exc})", file=sys.stderr)


def cancel_run(
    conf: Settings, record: dict[str, Any], out: Path, note: str | None = None
) -> tuple[int, int, list[str]]:
    """Cancel the run of ``record`` in every view: the flag its tasks stop at, its unsent videos dropped, its
    waiting messages taken off the queues (REVOKED in Flower), its record in Redis and in OUT/runs/ marked
    cancelled (with ``note``, why, when given), OUT freed. Return (waiting tasks revoked, videos not sent
    dropped, the workers running one of its tasks)."""
    r, broker = get_redis(conf.redis_url), get_redis(conf.broker)
    run_id = record["run_id"]
    cancel.request(r, run_id, conf.result_expires_s)
    unsent = completion.drop_pending(r, run_id)  # first, so no finishing task sends one of them
    from tasks import app

    live, seen = registry.live_workers(r), list(r.hkeys(keys.WORKER_SEEN))
    removed = 0
    for queue in stall.queue_names(broker, r, conf):
        gone = cancel.remove_waiting(broker, [queue], run_id)
        cancel.tell_flower(app, gone, cancel.revoker(queue, live, seen))
        removed += len(gone)
    running = [w["hostname"] for w in live if (w.get("current") or {}).get("run") == run_id]
    ended = {"status": "cancelled", "cancelled": time.time(), **({"cancel_note": note} if note else {})}
    runs.update(out, run_id, waiting_revoked=removed, unsent=unsent, **ended)
    published = runs.lookup(r, run_id)
    if published is not None:  # `framefleet status RUN` reads Redis: it says cancelled too
        runs.publish(r, {**published, **ended}, conf.result_expires_s)
    hold.release(r, out, run_id)
    _let_go(r, out, run_id, conf.finished_run_keep_s, sums.shards_of(published or record))
    return removed, unsent, running


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=common.HelpFormatter)
    parser.add_argument("run", nargs="?", metavar="RUN", help="the run id (printed when the run started)")
    parser.add_argument(
        "--out", type=buckets.root_arg, metavar="OUT", help="cancel the newest run of this output folder"
    )
    common.add_config_argument(parser)
    args = parser.parse_args(argv)
    if not args.run and args.out is None:
        parser.error("name the run: RUN or --out OUT")
    conf = common.settings_from(args)
    if (why := common.check_redis(conf)) is not None:
        return common.fail(why)
    r = get_redis(conf.redis_url)
    try:
        record = runs.find(r, args.run, args.out)
    except runs.RunNotFound as exc:
        return common.fail(str(exc))
    run_id = record["run_id"]
    out = Path(record.get("output_root") or args.out)
    if record.get("status") == "finished":
        return common.fail(f"run {run_id} has finished already; nothing to cancel", code=1)
    removed, unsent, running = cancel_run(conf, record, out)
    print(
        f"run {run_id} cancelled: {common.plural(removed, 'waiting task')} revoked"
        + (f", {common.plural(unsent, 'video')} not sent yet dropped" if unsent else "")
        + (
            f"; {common.plural(len(running), 'running task')} stop at their next check ({', '.join(running)})"
            if running
            else ""
        )
    )
    raw = record.get("raw_dir", "RAW_DIR")
    print(
        f"complete outputs in {out} are kept; `framefleet enqueue {raw} --out {out} --continue` "
        "(or `framefleet run` with --continue) finishes the rest"
    )
    return 0

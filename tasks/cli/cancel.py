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

import redis

from tasks.cli import common
from tasks.observe import stall
from tasks.redis_client import get_redis
from tasks.run import cancel, completion, runs
from tasks.statistics import sums
from tasks.workers import registry


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


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=common.HelpFormatter)
    parser.add_argument("run", nargs="?", metavar="RUN", help="the run id (printed when the run started)")
    parser.add_argument("--out", type=Path, metavar="OUT", help="cancel the newest run of this output folder")
    common.add_config_argument(parser)
    args = parser.parse_args(argv)
    if not args.run and args.out is None:
        parser.error("name the run: RUN or --out OUT")
    conf = common.settings_from(args)
    if (why := common.check_redis(conf)) is not None:
        return common.fail(why)
    r, broker = get_redis(conf.redis_url), get_redis(conf.broker)
    try:
        record = runs.find(r, args.run, args.out)
    except runs.RunNotFound as exc:
        return common.fail(str(exc))
    run_id = record["run_id"]
    out = Path(record.get("output_root") or args.out)
    if record.get("status") == "finished":
        return common.fail(f"run {run_id} has finished already; nothing to cancel", code=1)
    cancel.request(r, run_id, conf.result_expires_s)
    unsent = completion.drop_pending(r, run_id)  # first, so no finishing task sends one of them
    removed = cancel.remove_waiting(broker, stall.queue_names(broker, r, conf), run_id)
    from tasks import app

    cancel.tell_flower(app, removed)
    running = [w["hostname"] for w in registry.live_workers(r) if (w.get("current") or {}).get("run") == run_id]
    runs.update(out, run_id, status="cancelled", cancelled=time.time(), waiting_revoked=len(removed), unsent=unsent)
    _let_go(r, out, run_id, conf.finished_run_keep_s, sums.shards_of(runs.lookup(r, run_id) or record))
    print(
        f"run {run_id} cancelled: {common.plural(len(removed), 'waiting task')} revoked"
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

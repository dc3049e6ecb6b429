"""Every video of an output folder as JSON Lines: the manifest's entry with what the runs recorded of it.

    framefleet videos OUT [--status failed] > videos.jsonl

One line a video, in the manifest's order, with its id, path, status (done, failed, low_quality,
bad_input, ...), its reason when it has one, its quality figures and provenance: the same merge of the
manifest and each run's outcomes that ``--continue`` and the report read, streamed (a million videos
need no more memory than one run's outcomes). The lines load with the tools people know:

    pandas:  pandas.read_json("videos.jsonl", lines=True)
    DuckDB:  duckdb -c "SELECT status, count(*) FROM 'videos.jsonl' GROUP BY status"

Exit status 0; 2 when OUT is not a framefleet output folder.
"""

from __future__ import annotations

import argparse
import json
import sys

from tasks.cli import common
from tasks.outputs import buckets
from tasks.records import manifest


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=common.HelpFormatter)
    parser.add_argument("out", type=buckets.root_arg, metavar="OUT", help="a run's output folder")
    parser.add_argument(
        "--status", action="append", metavar="STATUS", help="only videos of this status (repeat for several)"
    )
    args = parser.parse_args(argv)
    if not (args.out / manifest.MANIFEST).is_file():
        return common.fail(f"{args.out} holds no framefleet run (no manifest.json); name a run's output folder")
    wanted = set(args.status or ())
    # A video of a wanted status has that status's key and value in its text as json.dumps writes them (the
    # run's fields when it has any, else its manifest line): the others are passed over unparsed.
    needles = tuple(f'"status": {json.dumps(status)}' for status in wanted)
    write = sys.stdout.write
    try:
        for own, fields in manifest.pairs(args.out):
            text = own if fields is None or '"status": ' not in fields else fields
            if wanted and not any(needle in text for needle in needles):
                continue
            line = manifest.merged(own, fields)
            if wanted and json.loads(line).get("status") not in wanted:
                continue
            write(line + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `framefleet videos OUT | head`: the reader has what it wanted
        sys.stdout = None  # type: ignore[assignment]  # nothing more to flush at exit
    return 0

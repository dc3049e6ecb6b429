"""Delete the intermediates (OUT/work/<video>/) of every video whose HDF5 file is complete.

    framefleet clean OUT

The dataset, its statistics and ``--continue`` need none of them: each finished video's partial
statistics live in OUT/markers/. Videos not finished keep theirs, so ``--continue`` resumes them
where they stopped. Exit status 0; 2 when OUT is not a framefleet output folder.
"""

from __future__ import annotations

import argparse

from tasks.cli import common
from tasks.outputs import buckets
from tasks.outputs.intermediates import clean, human_bytes


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=common.HelpFormatter)
    parser.add_argument("out", type=buckets.root_arg, metavar="OUT", help="a run's output folder")
    args = parser.parse_args(argv)
    if not (args.out / "manifest.json").is_file():
        return common.fail(f"{args.out} holds no framefleet run (no manifest.json); name a run's output folder")
    dropped, kept, freed = clean(args.out)
    print(
        f"dropped the intermediates of {common.plural(dropped, 'video')} ({human_bytes(freed)} freed)"
        + (f"; kept those of {common.plural(kept, 'unfinished video')} for --continue" if kept else "")
    )
    return 0

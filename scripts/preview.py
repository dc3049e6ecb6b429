"""Write a preview PNG per video: the first frame with its tracks and hand joints, its depth beside it.

    python scripts/preview.py OUT [--video VIDEO_ID]

Reads the stage intermediates under OUT/work/ and writes OUT/{video_id}.preview.png next to the
HDF5 file (tasks.preview draws it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tasks.outputs.preview import write_preview


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--video", action="append", help="a video id (default: every video with an HDF5 file)")
    args = ap.parse_args(argv)
    videos = args.video or sorted(p.stem for p in args.out.glob("*.hdf5"))
    if not videos:
        print(f"no .hdf5 files in {args.out}; run the pipeline first", file=sys.stderr)
        return 2
    for vid in videos:
        print(write_preview(args.out, vid))
    return 0


if __name__ == "__main__":
    sys.exit(main())

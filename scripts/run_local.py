#!/usr/bin/env python3
"""`framefleet run` (tasks/cli/run.py), for those who run the scripts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.cli.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

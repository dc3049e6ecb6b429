#!/usr/bin/env python3
"""Supervise this host's solo GPU workers (see tasks/autoscaler/cli.py, or --help).

python scripts/autoscaler.py [--gpus all|0,1] [--max-workers-per-gpu N] [--headroom-mib M]
                             [--tick-s S] [--cpu-workers N] [--config FILE] [--fake-gpu LEDGER]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.autoscaler.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write OUT/report.html for a finished run (see tasks/report/report.py).

python scripts/report.py OUT [--config FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.report.report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

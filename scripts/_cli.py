"""Put the project on the import path for the scripts, then re-export what they share from tasks.cli.common."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tasks.cli.common import HelpFormatter, add_config_argument, fail, settings_from  # noqa: E402

__all__ = ["ROOT", "HelpFormatter", "add_config_argument", "fail", "settings_from"]

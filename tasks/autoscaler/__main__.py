"""``python -m tasks.autoscaler``: the autoscaler's command line (tasks.autoscaler.cli)."""

import sys

from tasks.autoscaler.cli import main

sys.exit(main())

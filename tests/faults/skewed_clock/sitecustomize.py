"""Shift this process's wall clock (time.time, time.time_ns) by $FRAMEFLEET_TEST_CLOCK_SKEW_S seconds.

Put on PYTHONPATH for the processes of a test host whose clock is off. Python imports it before anything else,
so kombu (``from time import time``), Celery and framefleet all read the shifted clock; monotonic clocks stay
true. libfaketime cannot do this for Python here: version 0.9.10 shifts CLOCK_MONOTONIC too, which stalls
threading.Event.wait (the heartbeat thread), and with FAKETIME_DONT_FAKE_MONOTONIC=1 time.sleep fails (EINVAL).
"""

import os
import time

_SKEW_S = float(os.environ.get("FRAMEFLEET_TEST_CLOCK_SKEW_S") or 0)
if _SKEW_S:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _SKEW_S
    time.time_ns = lambda: _time_ns() + int(_SKEW_S * 1e9)

"""The coordinator's Redis outages as two log lines, not a line per failed call.

Every request, actor write, repair and lease renewal that fails because Redis
does not answer goes through `store_failed`: the first of an outage is logged
at WARNING, the rest are counted (DEBUG); a later success (`REDIS_OUTAGE.ok()`,
from lease renewals and actor writes) logs that Redis answers again, after how
long, and how many failures were not logged. A process runs one coordinator.
"""

from __future__ import annotations

import logging

from rsc.actors.errors import StoreError, StoreUnavailable
from rsc.outage import OutageLog

__all__ = ["REDIS_OUTAGE", "store_failed"]

REDIS_OUTAGE = OutageLog(logging.getLogger("rsc.redis"), "Redis")


def store_failed(logger: logging.Logger, exc: StoreError, message: str) -> None:
    """Log a failed store call: Redis not answering is part of an outage (`REDIS_OUTAGE`, one
    line for all of it); anything else is a line of its own on `logger`."""
    if isinstance(exc, StoreUnavailable):
        REDIS_OUTAGE.failed(message)
    else:
        logger.warning("%s", message)

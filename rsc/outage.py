"""Outages as log lines: one when something stops answering, one when it answers again.

A process that retries through an outage (the coordinator's Redis, a worker's
coordinator, a producer's Redis) would otherwise print a line per retry: per
request, per heartbeat, per actor. `OutageLog` prints the first failure at
WARNING, counts the repeats (each still at DEBUG), and when a call succeeds
again prints how long it lasted and how many failures it did not print:

    WARNING rsc.redis Redis unavailable, retrying: appending to g/orders/billing: Connection refused
    WARNING rsc.redis Redis answers again after 8.1 s (37 repeated failures not logged)

An outage ends at the first success after `settle_s` without a failure: in a
partial one (one cluster node down) calls to the other nodes go on
succeeding, and that is still one outage, not a begin/end pair per call.
It is thread-safe (the sync producer's heartbeat thread and publishing threads
share one), and knows nothing of trio: time is `time.monotonic` unless given.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable


class OutageLog:
    """The outages of one dependency (`what`), logged to `logger` as begin and end lines."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        down: str = "unavailable",
        up: str = "answers again",
        settle_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what
        self.down = down
        self.up = up
        self.settle_s = settle_s
        self.clock = clock
        self.last_failure = -math.inf
        #: When the outage under way began, or None.
        self.since: float | None = None
        #: Failures since it began that were not logged at WARNING.
        self.repeats = 0
        #: Outages so far.
        self.outages = 0
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget an outage under way (a new start: nothing has failed yet)."""
        with self._lock:
            self.since, self.repeats, self.last_failure = None, 0, -math.inf

    def failed(self, why: object) -> None:
        """A call failed because `what` did not answer: the first line of an outage, or a repeat."""
        with self._lock:
            self.last_failure = self.clock()
            if self.since is None:
                self.since = self.last_failure
                self.repeats = 0
                self.outages += 1
                first = True
            else:
                self.repeats += 1
                first = False
        if first:
            self.logger.warning("%s %s, retrying: %s", self.what, self.down, why)
        else:
            self.logger.debug("%s %s (repeat %d): %s", self.what, self.down, self.repeats, why)

    def ok(self) -> None:
        """A call succeeded: the outage under way (if any) is over."""
        if self.since is None:  # the common case, without the lock
            return
        with self._lock:
            now = self.clock()
            if self.since is None or now - self.last_failure < self.settle_s:
                return
            lasted, repeats = now - self.since, self.repeats
            self.since = None
        self.logger.warning(
            "%s %s after %.1f s (%d repeated failure%s not logged)",
            self.what,
            self.up,
            lasted,
            repeats,
            "" if repeats == 1 else "s",
        )

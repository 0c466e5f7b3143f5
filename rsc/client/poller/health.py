"""Redis outages as pollers see them, and how long to wait after a failed call."""

from __future__ import annotations

import logging
import math
import random

import trio

from rsc.client.coordinator import Backoff
from rsc.client.errors import RedisUnavailable
from rsc.client.poller.settings import OUTAGE_OVER_S, REDIS_BACKOFF, REFUSAL_RETRY_S
from rsc.outage import OutageLog

__all__ = ["RedisHealth"]

log = logging.getLogger("rsc.client.poller")


class RedisHealth:
    """Redis outages as pollers see them: one log line when one starts, one when it ends
    (`rsc.outage.OutageLog`: with how long it lasted and how many failures were not logged).

    The pollers of one process share one (`App` does), so an outage is one line, not one
    per member.
    """

    def __init__(self, name: str, backoff: Backoff = REDIS_BACKOFF) -> None:
        self.name = name
        self.backoff = backoff
        self.failures = 0
        self.outage = OutageLog(log, f"{name}: Redis", settle_s=OUTAGE_OVER_S, clock=trio.current_time)
        self._refused: dict[str, float] = {}
        self._rng = random.Random()

    @property
    def since(self) -> float | None:
        """When the outage under way began, or None."""
        return self.outage.since

    @property
    def outages(self) -> int:
        return self.outage.outages

    def wait_after(self, exc: Exception) -> float:
        """Note a failed Redis call (an outage, or a refusal: logged once per distinct message
        and minute) and return how long to wait before trying again."""
        self.failures += 1
        if isinstance(exc, RedisUnavailable):
            self.outage.failed(exc)
        else:  # a refusal, maybe of one shard only: logged once per distinct message and minute
            now = trio.current_time()
            if self._refused.get(str(exc), -math.inf) < now - 60:
                if len(self._refused) > 100:
                    self._refused.clear()
                self._refused[str(exc)] = now
                log.error("%s: Redis refused a command, retrying: %s", self.name, exc)
            return max(REFUSAL_RETRY_S, self.delay())
        return self.delay()

    def delay(self) -> float:
        """How long to wait before trying again (exponential, with jitter)."""
        return self.backoff.delay(min(self.failures, 16), self._rng)

    def ok(self) -> None:
        """A Redis call succeeded. An outage ends when none failed for `OUTAGE_OVER_S` (in a
        partial one, say one cluster node down, calls to the others go on succeeding)."""
        self.outage.ok()
        if self.outage.since is None:
            self.failures = 0

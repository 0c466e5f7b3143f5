"""Clocks: where actors get `now` (milliseconds) for the commands they build.

Waiting (ticks, idle timeouts) always uses trio's clock, so tests can run
under `MockClock(autojump_threshold=0)`; `TrioClock` derives `now` from that
same clock, `WallClock` from wall time anchored to the monotonic clock (a
wall-clock step never makes every lease expire at once).
"""

from __future__ import annotations

import time
from typing import Protocol

import trio


class Clock(Protocol):
    def now_ms(self) -> int: ...


class WallClock:
    """Milliseconds since the Unix epoch, advancing with the monotonic clock."""

    def __init__(self) -> None:
        self._wall_ms = time.time_ns() // 1_000_000
        self._monotonic = time.monotonic()

    def now_ms(self) -> int:
        return self._wall_ms + int((time.monotonic() - self._monotonic) * 1000)


class TrioClock:
    """Milliseconds of trio's current clock (virtual under MockClock)."""

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return self.offset_ms + int(trio.current_time() * 1000)

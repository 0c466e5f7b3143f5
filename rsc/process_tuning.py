"""What a long-running rsc process (`rsc serve`, `rsc worker`) sets up at start: the garbage
collector's thresholds. Its own module, so that a worker does not load the coordinator."""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "tune_gc"]


#: The service's collector thresholds (CPython's default is 700, 10, 10). A batch of 100
#: heartbeats allocates tens of thousands of short-lived objects; at the default the
#: collector ran many times per request and took about a quarter of the CPU
#: (bench/heartbeat.py: 44 -> 34 us of CPU per member heartbeat). Cycles are still
#: collected, only in larger steps.
GC_THRESHOLDS = (70_000, 10, 100)


def tune_gc() -> None:
    """For a long-running service process: freeze what start-up built, collect in larger steps.

    `gc.freeze` moves every object alive now (modules, the app, its routes) out of the
    collector's sight, so full collections no longer walk them again and again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

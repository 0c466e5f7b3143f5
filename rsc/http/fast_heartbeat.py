"""Deprecated: 0.2.0's path of the heartbeat fast path below Quart
(it moved to `rsc.http.heartbeats.fast_path` in 0.3.0).

Kept for one more minor release, with a `DeprecationWarning`: import `rsc.http.heartbeats.fast_path`."""

from __future__ import annotations

import warnings
from typing import Any

import rsc.http.heartbeats.fast_path as _moved
from rsc.http.heartbeats.fast_path import *  # noqa: F403  (what code written against 0.2.0 imports from here)

warnings.warn(
    "rsc.http.fast_heartbeat is deprecated: it moved to rsc.http.heartbeats.fast_path",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Every other name of the module, from where it lives now."""
    return getattr(_moved, name)

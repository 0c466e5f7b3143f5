"""Deprecated: 0.2.0's path of the Quart routes of member heartbeats
(it moved to `rsc.http.heartbeats.routes` in 0.3.0).

Kept for one more minor release, with a `DeprecationWarning`: import `rsc.http.heartbeats.routes`."""

from __future__ import annotations

import warnings
from typing import Any

import rsc.http.heartbeats.routes as _moved
from rsc.http.heartbeats.routes import *  # noqa: F403  (what code written against 0.2.0 imports from here)

warnings.warn(
    "rsc.http.heartbeat_routes is deprecated: it moved to rsc.http.heartbeats.routes",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Every other name of the module, from where it lives now."""
    return getattr(_moved, name)

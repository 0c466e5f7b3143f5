"""Deprecated: 0.2.0's path of the steady-heartbeat answers
(it moved to `rsc.http.heartbeats.steady` in 0.3.0).

Kept for one more minor release, with a `DeprecationWarning`: import `rsc.http.heartbeats.steady`."""

from __future__ import annotations

import warnings
from typing import Any

import rsc.http.heartbeats.steady as _moved
from rsc.http.heartbeats.steady import *  # noqa: F403  (what code written against 0.2.0 imports from here)

warnings.warn(
    "rsc.http.steady_heartbeats is deprecated: it moved to rsc.http.heartbeats.steady",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Every other name of the module, from where it lives now."""
    return getattr(_moved, name)

"""Deprecated: 0.2.0's path of the coordinator process's wiring (serve, open_coordinator)
(it moved to `rsc.coordinator_process` in 0.3.0).

Kept for one more minor release, with a `DeprecationWarning`: import `rsc.coordinator_process`."""

from __future__ import annotations

import warnings
from typing import Any

import rsc.coordinator_process as _moved
from rsc.coordinator_process import *  # noqa: F403  (what code written against 0.2.0 imports from here)

warnings.warn(
    "rsc.http.service is deprecated: it moved to rsc.coordinator_process", DeprecationWarning, stacklevel=2
)


def __getattr__(name: str) -> Any:
    """Every other name of the module, from where it lives now."""
    return getattr(_moved, name)

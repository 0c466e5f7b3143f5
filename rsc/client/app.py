"""Deprecated: 0.1.0's path of the worker's `App` (it moved to `rsc.client.worker` in 0.2.0).

Kept for one more minor release, with a `DeprecationWarning`; import `App` from `rsc`
(`from rsc import App`) or `rsc.client.worker`."""

from __future__ import annotations

import logging
import warnings

from rsc.client.worker import *  # noqa: F403  (what 0.1.0 applications import from here)
from rsc.client.worker import App

MOVED = "rsc.client.app is deprecated: App moved to rsc.client.worker; use `from rsc import App`"
warnings.warn(MOVED, DeprecationWarning, stacklevel=2)
logging.getLogger("rsc").warning("%s (it goes in 0.3.0)", MOVED)  # seen under `rsc worker` too

__all__ = ["App"]

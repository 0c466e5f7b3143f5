"""Public names never vanish: each module moved in 0.3.0 still imports from its 0.2.0 path,
with a `DeprecationWarning`, and hands out the same objects (public and private names)."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {
    "rsc.http.service": ("rsc.coordinator_process", ("serve", "open_coordinator", "Running")),
    "rsc.http.heartbeat_routes": ("rsc.http.heartbeats.routes", ("add_heartbeat_routes", "HeartbeatAnswers")),
    "rsc.http.fast_heartbeat": ("rsc.http.heartbeats.fast_path", ("HeartbeatFastPath", "PATH", "BATCH_PATH")),
    "rsc.http.steady_heartbeats": ("rsc.http.heartbeats.steady", ()),
    "rsc.http.held_answers": ("rsc.http.heartbeats.held", ()),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_still_imports_with_a_deprecation_warning(old: str) -> None:
    new, names = MOVED[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: it moved to {new}"):
        shim = importlib.import_module(old)
    moved = importlib.import_module(new)
    for name in names or [n for n in vars(moved) if not n.startswith("__")][:5]:
        assert getattr(shim, name) is getattr(moved, name), name

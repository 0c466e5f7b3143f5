"""Journals written by the previous release read through today's reading path, and an upcast of
their real entries.

`tests/compat/journals/v0.1.0.json` holds every journal entry a v0.1.0 coordinator wrote
(the baseline of `tests/compat/BASELINE`, run with `--demo`, three members joining and one
leaving over HTTP): two groups and two streams, 13 event types. Today's aggregates must read each
entry (its data is version 1: no `v` field) and fold it into the state 0.1.0 meant.

No event type has a version 2 yet (docs/persistence.md), so the upcast below runs a table of the
test's own: what a reader does with a real 0.1.0 entry once an event's data changes shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from rsc.actors import aggregates
from rsc.actors.aggregates import GroupAggregate, StreamAggregate
from rsc.actors.errors import UnsupportedSchema
from rsc.events import group, stream
from rsc.events.events import MemberJoined
from rsc.events.versions import STATIC_LEVEL, EventVersion

CORPUS = Path(__file__).parents[1] / "compat" / "journals" / "v0.1.0.json"
JOURNALS: dict[str, list[dict[str, str]]] = json.loads(CORPUS.read_text())


def _read(key: str, reader: Any) -> list[Any]:
    return [reader.event_from_json(e["data"], int(e.get("v") or 1)) for e in JOURNALS[key]]


def test_every_entry_of_a_v0_1_0_journal_is_read_and_folds_into_the_state_it_meant() -> None:
    kinds = {json.loads(e["data"])["type"] for entries in JOURNALS.values() for e in entries}
    assert len(kinds) >= 13  # the fixture covers what 0.1.0 wrote
    groups = GroupAggregate.__new__(GroupAggregate)
    streams = StreamAggregate.__new__(StreamAggregate)
    for key, entries in JOURNALS.items():
        reader = groups if "{g/" in key else streams
        events = _read(key, reader)
        assert [type(e).__name__ for e in events] == [e["kind"] for e in entries]
        if reader is streams:
            state = stream.fold(events)
            assert state is not None
            assert len(state.layout.shards) == 4
            continue
        folded = group.fold(events)
        assert folded is not None
        if key == "rsc:v1:{g/fixture/billing}:journal":
            # m0, m1, m2 joined, m1 left; the others were fenced when their leases ran out.
            assert not folded.members
            assert not folded.owners
            assert {m: t.reason.value for m, t in folded.fenced.items()} == {
                "m0": "LEASE_EXPIRED",
                "m2": "LEASE_EXPIRED",
            }


def test_a_real_0_1_0_entry_is_upcast_before_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    def add_static(data: dict[str, Any]) -> dict[str, Any]:
        """A version 2 of MemberJoined that says `static` always (the test's own table)."""
        seen.append(data)
        return {**data, "static": data.get("static", False)}

    monkeypatch.setattr(
        aggregates, "EVENT_VERSIONS", {"MemberJoined": (EventVersion(2, STATIC_LEVEL, add_static),)}
    )
    reader = GroupAggregate.__new__(GroupAggregate)
    joins = [e for e in _read("rsc:v1:{g/fixture/billing}:journal", reader) if isinstance(e, MemberJoined)]
    assert [e.member_id for e in joins] == ["m0", "m1", "m2"]
    assert len(seen) == 3  # each real v1 entry went through the upcaster
    assert all("static" not in data for data in seen)
    assert all(e.static is False for e in joins)
    # An entry written at version 2 is read as it is (no upcaster runs for it).
    v2 = attrs.evolve(joins[0], static=True)
    _, data = reader.event_to_json(v2)
    assert reader.event_from_json(data, 2) == v2
    assert len(seen) == 3
    # A version newer than this release knows is refused, naming the way out.
    with pytest.raises(UnsupportedSchema, match="newer release"):
        reader.event_from_json(data, 3)

"""`decide` and `execute` never change what they are given, for both aggregates.

The group and stream state machines (tests/core/test_group_machine.py,
tests/core/test_stream_machine.py) generate the command sequences: joins, leaves,
crashes, rogue heartbeats, ticks, reshards, removals, deletions, producers
coming and going. Here every command they run is decided and executed
against the current state and lease table, and both are compared with deep
copies taken before: field by field (every attrs field, compared or not) and
by value. `decide` must also give the events `execute` gives.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
from hypothesis import HealthCheck, settings

from rsc.events import group, stream
from rsc.events.commands import GroupCommand, Heartbeat, StreamCommand
from rsc.events.errors import CoordinationError
from rsc.events.events import GroupEvent, StreamEvent
from rsc.events.liveness import Leases
from rsc.events.stream import StreamState
from tests.core import test_group_machine, test_stream_machine  # modules: their Test* classes run there only
from tests.groupkit import Group


def fields(state: Any) -> Any:
    """Every field of `state`, recursively, sets kept as sets (None stays None)."""
    return None if state is None else attrs.asdict(state)  # attrs.asdict keeps sets as sets


def assert_unchanged(state: Any, state_copy: Any, leases: Leases, leases_copy: Leases) -> None:
    assert fields(state) == fields(state_copy)
    assert state == state_copy
    assert dict(leases) == dict(leases_copy)


def decided(decide: Any, state: Any, command: Any) -> list[Any] | type[CoordinationError]:
    try:
        events: list[Any] = decide(state, command)
    except CoordinationError as refusal:
        return type(refusal)
    return events


class CheckedGroup(Group):
    """A `Group` whose every command is checked: the state and the lease table stay as they were."""

    def execute(self, command: GroupCommand) -> list[GroupEvent]:
        given, state_copy, leases_copy = self.state, copy.deepcopy(self.state), copy.deepcopy(self.leases)
        by_decide = decided(lambda state, c: group.decide(state, c, self.level, self.leases), given, command)
        assert_unchanged(given, state_copy, self.leases, leases_copy)
        refused: CoordinationError | None = None
        try:
            events = super().execute(command)
        except CoordinationError as refusal:
            refused = refusal
        assert_unchanged(given, state_copy, self.leases, leases_copy)
        if refused is not None:
            assert by_decide is type(refused)
            raise refused
        assert by_decide == events
        return events


class CheckedGroupMachine(test_group_machine.GroupMachine):
    def __init__(self) -> None:
        super().__init__()
        self.g = CheckedGroup.create(shards=4)


class CheckedStreamMachine(test_stream_machine.StreamMachine):
    def execute(
        self, state: StreamState | None, command: StreamCommand
    ) -> tuple[StreamState, list[StreamEvent]]:
        state_copy, leases_copy = copy.deepcopy(state), copy.deepcopy(self.leases)
        by_decide = decided(stream.decide, state, command)
        assert_unchanged(state, state_copy, self.leases, leases_copy)
        refused: CoordinationError | None = None
        try:
            after, events = super().execute(state, command)
        except CoordinationError as refusal:
            refused = refusal
        assert_unchanged(state, state_copy, self.leases, leases_copy)
        if refused is not None:
            assert by_decide is type(refused)
            raise refused
        assert by_decide == events
        return after, events


PURITY = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
CheckedGroupMachine.TestCase.settings = PURITY
CheckedStreamMachine.TestCase.settings = PURITY
TestGroupDecidePurity = CheckedGroupMachine.TestCase
TestStreamDecidePurity = CheckedStreamMachine.TestCase


def test_a_heartbeat_leaves_the_callers_state_and_table_alone() -> None:
    """The case that was not pure: a heartbeat renewed a lease inside the state it was given."""
    g = Group.create()
    g.hb("a", 0)
    state_copy, leases_copy = copy.deepcopy(g.state), copy.deepcopy(g.leases)
    epoch = g.state.members["a"].member_epoch
    events = group.decide(g.state, Heartbeat("a", "inc-1", epoch, now_ms=1_000, owned=frozenset(range(6))))
    assert [type(e).__name__ for e in events] == ["MemberHeartbeated"]
    assert_unchanged(g.state, state_copy, g.leases, leases_copy)

"""An operator's pause and resume of a group in the pure group aggregate (feature level 7).

A pause empties the target at once: each member is asked to revoke what it holds through the
ordinary protocol (revoke, acknowledge, release) and gets nothing while it lasts; it keeps its
membership and heartbeats; a new member joins with nothing. A resume assigns again. Both are
idempotent, journaled, refused below level 7, and a pause needs a reason of plain text.
"""

from __future__ import annotations

import pytest

from rsc.events.commands import PauseGroup, RecordPositionReset, ResumeGroup
from rsc.events.errors import FeatureLevelRequired, InvalidCommand
from rsc.events.events import GroupPaused, GroupPositionReset, GroupResumed
from rsc.events.versions import EVENT_LEVELS, GROUP_OPS_LEVEL
from tests.groupkit import Group


def settle(g: Group, members: tuple[str, ...], rounds: int = 6) -> None:
    for _ in range(rounds):
        for member_id in members:
            member = g.state.members.get(member_id)
            epoch = member.member_epoch if member is not None else 0
            owned = member.installed if member is not None else frozenset()
            revoked = member.revoking if member is not None else frozenset()
            g.hb(member_id, epoch, owned - revoked, revoked)


def test_a_paused_group_hands_every_shard_back_then_resumes() -> None:
    g = Group.create(shards=6)
    settle(g, ("w1", "w2"))
    assert len(g.state.owners) == 6
    events = g.run(PauseGroup("downstream down", g.now))
    assert [type(e).__name__ for e in events] == ["GroupPaused", "TargetAssignmentUpdated"]
    assert g.state.paused is not None
    assert g.state.paused.reason == "downstream down"
    # the next heartbeat asks each member to revoke all it holds, by the ordinary protocol
    held = g.state.members["w1"].assigned
    answer = g.hb("w1", g.state.members["w1"].member_epoch, held)
    assert answer.assignment.revoke == held
    assert not answer.assignment.assigned
    settle(g, ("w1", "w2", "w3"))  # a member joining meanwhile gets nothing either
    assert not g.state.owners
    assert set(g.state.members) == {"w1", "w2", "w3"}  # membership and heartbeats go on
    assert all(not m.assigned for m in g.state.members.values())
    assert g.run(PauseGroup("again", g.now)) == []  # idempotent: the first reason stays
    assert g.state.paused.reason == "downstream down"
    events = g.run(ResumeGroup(g.now))
    assert isinstance(events[0], GroupResumed)
    settle(g, ("w1", "w2", "w3"))
    assert len(g.state.owners) == 6
    assert {len(m.assigned) for m in g.state.members.values()} == {2}
    assert g.run(ResumeGroup(g.now)) == []


def test_group_operations_need_level_7_and_a_plain_reason() -> None:
    assert {EVENT_LEVELS[e.__name__] for e in (GroupPaused, GroupResumed, GroupPositionReset)} == {
        GROUP_OPS_LEVEL
    }
    g = Group.create(shards=2)
    g.level = GROUP_OPS_LEVEL - 1
    for command in (PauseGroup("x", 0), ResumeGroup(0), RecordPositionReset({0: "1-0"}, "admin", "{}", 0)):
        with pytest.raises(FeatureLevelRequired):
            g.run(command)
    g.level = GROUP_OPS_LEVEL
    for bad in ("", "a\nb", "x" * 201):
        with pytest.raises(InvalidCommand):
            g.run(PauseGroup(bad, 0))
    events = g.run(RecordPositionReset({0: "5-0", 1: "0-0"}, "admin", '{"to":"earliest"}', 7))
    assert events == [GroupPositionReset({0: "5-0", 1: "0-0"}, "admin", '{"to":"earliest"}', 7)]

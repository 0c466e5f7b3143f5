"""Quiet members advance with the target (feature level 8): a new target moves every member
whose shards it keeps to its epoch, in the one `TargetAssignmentUpdated`, so that a rebalance
storm journals one event per target and not one `MemberEpochAdvanced` per member; below
level 8 every member advances on its own heartbeat, as before."""

from __future__ import annotations

import json

from rsc.events import codec
from rsc.events.events import GroupEvent, MemberEpochAdvanced, TargetAssignmentUpdated
from rsc.events.model import FenceReason, HeartbeatStatus, MemberState
from rsc.events.versions import (
    ADVANCE_LEVEL,
    EVENT_VERSIONS,
    GROUP_OPS_LEVEL,
    MAX_FEATURE_LEVEL,
    current_event_version,
    upcast,
)
from rsc.events.wire import HeartbeatResponse
from tests.groupkit import Group

OK = HeartbeatStatus.OK
FENCED = HeartbeatStatus.FENCED


def durable(events: list[GroupEvent]) -> list[str]:
    return [type(e).__name__ for e in events if e.durable]


def heartbeat(
    g: Group, member: str, epoch: int, owned: frozenset[int]
) -> tuple[HeartbeatResponse, list[GroupEvent]]:
    """A heartbeat's answer and the events it caused."""
    start = len(g.events)
    answer = g.hb(member, epoch, owned=owned)
    return answer, g.events[start:]


def round_trip(event: GroupEvent) -> GroupEvent:
    """`event` written as journal data and read back (a version 1 reader's view is the data)."""
    data = codec.to_json(event, GroupEvent)
    back: GroupEvent = codec.converter.structure(json.loads(data), GroupEvent)
    return back


def settled(g: Group, answers: dict[str, HeartbeatResponse], rounds: int = 6) -> dict[str, HeartbeatResponse]:
    """Every member heartbeats honestly (acknowledging revokes at once) until all is stable."""
    for _ in range(rounds):
        for m in sorted(answers):
            r = answers[m]
            owned = r.assignment.assigned - r.assignment.revoke
            answers[m] = g.hb(m, r.member_epoch, owned=owned, revoked=r.assignment.revoke)
        if all(g.state.member_state(x) is MemberState.STABLE for x in g.state.members.values()):
            return answers
    raise AssertionError("the group did not settle")


def three_on_six(level: int = MAX_FEATURE_LEVEL) -> tuple[Group, dict[str, HeartbeatResponse]]:
    """a, b and c hold two shards each, reconciled."""
    g = Group.create(shards=6)
    g.level = level
    answers = {m: g.hb(m, 0) for m in "abc"}
    return g, settled(g, answers)


def join_d(g: Group) -> tuple[set[str], HeartbeatResponse]:
    """d joins: the new target gives it two shards; the members that keep theirs are returned."""
    before = dict(g.state.target)
    r = g.hb("d", 0)
    kept = {m for m in "abc" if g.state.target[m] == before[m]}
    assert kept
    assert len(kept) < 3
    return kept, r


def test_a_target_moves_the_members_whose_shards_it_keeps_to_its_epoch() -> None:
    g, answers = three_on_six()
    old = {m: answers[m].member_epoch for m in "abc"}
    known = {m: g.state.members[m].previous_epoch for m in "abc"}  # what its last advance heard
    kept, _ = join_d(g)
    state = g.state
    for m in kept:
        member = state.members[m]
        assert member.member_epoch == state.assignment_epoch > old[m]
        assert member.quiet
        assert member.previous_epoch == known[m] < old[m]
        assert state.member_state(member) is MemberState.STABLE
    moved = {"a", "b", "c"} - kept
    assert all(state.members[m].member_epoch == old[m] and not state.members[m].quiet for m in moved)
    update = [e for e in g.events if isinstance(e, TargetAssignmentUpdated)][-1]
    assert update.advances


def test_a_quiet_member_heartbeats_with_its_old_epoch_and_nothing_is_journaled() -> None:
    g, answers = three_on_six()
    kept, _ = join_d(g)
    m = sorted(kept)[0]
    r = answers[m]
    answer, events = heartbeat(g, m, r.member_epoch, r.assignment.assigned)
    assert answer.status is OK
    assert answer.member_epoch == g.state.assignment_epoch
    assert answer.assignment.assigned == r.assignment.assigned
    assert durable(events) == []
    # told: its next heartbeat carries the new epoch, and is as steady as any
    again, events = heartbeat(g, m, answer.member_epoch, answer.assignment.assigned)
    assert durable(events) == []
    assert again.status is OK


def test_a_quiet_member_is_accepted_with_any_epoch_since_it_was_last_told() -> None:
    """Targets come faster than a member's heartbeats in a storm: a member moved by several
    is still accepted with any epoch it may have heard since the one it surely knows, and
    nothing older."""
    g = Group.create(shards=6)
    answers: dict[str, HeartbeatResponse] = {}
    for m in "abcdef":  # one at a time: a gives shards up (and advances) five times
        answers = settled(g, {**answers, m: g.hb(m, 0)})
    told = answers["a"].member_epoch
    known = g.state.members["a"].previous_epoch  # what its heartbeat carried when it advanced
    for n in range(3):  # a seventh member comes and goes: it gets no shard, nobody's move
        g.hb(f"x{n}", 0)
        g.hb(f"x{n}", -1)
    member = g.state.members["a"]
    assert member.quiet
    assert member.member_epoch >= told + 6  # (a join and a leave move every epoch: 3 times 2)
    assert member.previous_epoch == known
    assert 1 < known < told
    owned = answers["a"].assignment.assigned
    for epoch in (known, told, told + 1, member.member_epoch - 1):
        r = g.hb("a", epoch, owned=owned)
        assert r.status is OK
        assert r.member_epoch == member.member_epoch
    # older than the one it surely knows: stale (epoch 0 would be a join)
    assert g.hb("a", known - 1, owned=owned).status is FENCED


def test_a_lost_answer_then_a_target_that_moves_the_member_keeps_its_retry() -> None:
    """A member advances on its heartbeat at epoch E and the answer is lost; a target then
    moves it quietly: its retry, still at E, is its own (review finding: the window started at
    the epoch of the lost answer, and the retry was fenced)."""
    g = Group.create(shards=6)
    answers = settled(g, {m: g.hb(m, 0) for m in "abcdef"})  # one shard each
    g.scale(7, version=2)  # shard 6 goes to one member: its target changes, nobody else's
    (gainer,) = [m for m in "abcdef" if g.state.target[m] != answers[m].assignment.assigned]
    sent, owned = answers[gainer].member_epoch, answers[gainer].assignment.assigned
    lost = g.hb(gainer, sent, owned=owned, metadata_version=1)  # advances; the answer is lost
    assert lost.member_epoch > sent
    assert not g.state.members[gainer].quiet
    g.scale(7, version=3)  # a layout of the same shards: a target that moves every member quietly
    assert g.state.members[gainer].quiet
    retry = g.hb(gainer, sent, owned=owned, metadata_version=1)
    assert retry.status is OK
    assert retry.member_epoch == g.state.members[gainer].member_epoch


def test_only_a_heartbeat_at_the_member_s_epoch_acknowledges_a_revoke() -> None:
    """A revoke is asked for at the member's epoch, which stays while it revokes: a request at
    an older epoch (a delayed or duplicated one, accepted as a lost answer's) that does not
    report a revoking shard does not release it (review finding)."""
    g, answers = three_on_six()
    member_id = "a"
    r = answers[member_id]
    g.hb("d", 0)  # a target that takes shards from some of a, b, c
    for k in "abc":
        r = answers[k]
        answers[k] = g.hb(k, r.member_epoch, owned=r.assignment.assigned)
    revoking = {k: g.state.members[k] for k in "abc" if g.state.members[k].revoking}
    assert revoking
    k, member = next(iter(revoking.items()))
    older = member.previous_epoch
    assert older < member.member_epoch
    assert member.member_epoch == answers[k].member_epoch
    # an older request reporting none of the revoking shards: no release
    stale = g.hb(k, older, owned=member.assigned)
    assert g.state.members[k].revoking == member.revoking
    assert stale.status is not FENCED
    # the same at its epoch acknowledges them
    g.hb(k, member.member_epoch, owned=member.assigned)
    assert not g.state.members[k].revoking


def test_an_old_epoch_reporting_what_it_does_not_hold_is_fenced() -> None:
    g, answers = three_on_six()
    kept, _ = join_d(g)
    m = sorted(kept)[0]
    r = answers[m]
    other = next(iter(g.state.members[next(iter({"a", "b", "c"} - {m}))].assigned))
    answer = g.hb(m, r.member_epoch, owned=r.assignment.assigned | {other})
    assert (answer.status, answer.fence_reason) == (FENCED, FenceReason.STALE_EPOCH)


def test_a_quiet_member_that_then_moves_keeps_the_epoch_it_sent_for_a_lost_answer() -> None:
    """A quiet member's next `MemberEpochAdvanced` names the epoch its heartbeat carried
    (`heard`): if that answer is lost, the retry with that epoch is still its own."""
    g, answers = three_on_six()
    kept, _ = join_d(g)
    m = sorted(kept)[0]
    told = answers[m].member_epoch
    owned = answers[m].assignment.assigned
    # a layout change gives every member a new target: m too advances on its own heartbeat
    g.scale(9, version=2)
    r = g.hb(m, told, owned=owned, metadata_version=1)
    advanced = [e for e in g.events if isinstance(e, MemberEpochAdvanced) and e.member_id == m]
    assert advanced
    assert advanced[-1].heard == told
    member = g.state.members[m]
    assert not member.quiet
    assert member.previous_epoch == told
    # the answer was lost: the same heartbeat again
    again = g.hb(m, told, owned=owned, metadata_version=1)
    assert again.status is not FENCED
    assert again.member_epoch == r.member_epoch


def test_below_level_8_every_member_advances_on_its_own_heartbeat() -> None:
    g, answers = three_on_six(level=GROUP_OPS_LEVEL)
    kept, _ = join_d(g)
    update = [e for e in g.events if isinstance(e, TargetAssignmentUpdated)][-1]
    assert not update.advances
    m = sorted(kept)[0]
    assert g.state.members[m].member_epoch == answers[m].member_epoch
    assert not any(x.quiet for x in g.state.members.values())
    _, events = heartbeat(g, m, answers[m].member_epoch, answers[m].assignment.assigned)
    assert durable(events) == ["MemberEpochAdvanced"]
    assert [e.heard for e in events if isinstance(e, MemberEpochAdvanced)] == [None]


def test_the_new_fields_are_version_2_of_their_events_from_level_8() -> None:
    for kind in ("TargetAssignmentUpdated", "MemberEpochAdvanced"):
        assert current_event_version(kind, GROUP_OPS_LEVEL, EVENT_VERSIONS) == 1
        assert current_event_version(kind, ADVANCE_LEVEL, EVENT_VERSIONS) == 2
    update = TargetAssignmentUpdated(4, {"a": frozenset({1})}, 9, advances=True)
    assert round_trip(update) == update
    advanced = MemberEpochAdvanced("a", 4, heard=2)
    assert round_trip(advanced) == advanced
    # what version 1 wrote reads as it meant: no member moves with the target, no epoch heard
    for v1 in (TargetAssignmentUpdated(4, {}, 9), MemberEpochAdvanced("a", 4)):
        data = json.loads(codec.to_json(v1, GroupEvent))
        assert "advances" not in data
        assert "heard" not in data
        kind = type(v1).__name__
        assert upcast(kind, 1, dict(data), EVENT_VERSIONS) == data
        assert round_trip(v1) == v1

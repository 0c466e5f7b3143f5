"""Static membership in the pure group aggregate (feature level 4).

A static member's shards wait for it while it restarts (its hold), a new incarnation of its
id takes it over at once (the old one is fenced with reason REPLACED and stays superseded),
shards of a member fenced while its lease may still run are installed to nobody until it
ends (quarantine), and a member that is not static gets its shards back on a quick rejoin
when that costs no extra move (memory).
"""

from __future__ import annotations

import attrs
import pytest

from rsc.events.commands import ApplyLayout, ConfigureGroup, Heartbeat, RemoveMember
from rsc.events.errors import IncarnationMismatch
from rsc.events.events import (
    AssignmentHeld,
    HoldEnded,
    MemberFenced,
    QuarantineEnded,
    ShardsQuarantined,
)
from rsc.events.model import FenceReason, GroupConfig, HeartbeatStatus, ShardState
from rsc.events.versions import EVENT_LEVELS
from rsc.events.wire import HeartbeatResponse
from tests.groupkit import TIMING, Group


def settle(g: Group, members: dict[str, str], static: bool = True, rounds: int = 6) -> None:
    """Every member in `members` (id -> incarnation) heartbeats honestly, acking at once."""
    for _ in range(rounds):
        for member_id, incarnation in sorted(members.items()):
            member = g.state.members.get(member_id)
            epoch = member.member_epoch if member is not None else 0
            owned = member.installed if member is not None else frozenset()
            revoked = member.revoking if member is not None else frozenset()
            g.hb(member_id, epoch, owned - revoked, revoked, incarnation, static=static)


def three_static(shards: int = 12) -> Group:
    g = Group.create(shards=shards)
    settle(g, {"w1": "a1", "w2": "a2", "w3": "a3"})
    assert {len(g.state.target_of(m)) for m in ("w1", "w2", "w3")} == {shards // 3}
    assert all(g.state.members[m].assigned == g.state.target_of(m) for m in ("w1", "w2", "w3"))
    return g


def leave_gracefully(g: Group, member_id: str, incarnation: str) -> HeartbeatResponse:
    """The member's leave: `leaving` heartbeats, every revoke acked, then epoch -1."""
    member = g.state.members[member_id]
    r = g.hb(
        member_id, member.member_epoch, member.assigned, frozenset(), incarnation, static=True, leaving=True
    )
    assert r.assignment.revoke == member.assigned  # a static member revokes everything at once
    assert not r.assignment.pending
    r = g.hb(
        member_id, r.member_epoch, frozenset(), r.assignment.revoke, incarnation, static=True, leaving=True
    )
    return g.hb(member_id, -1, frozenset(), frozenset(), incarnation, static=True)


def test_a_static_member_that_restarts_within_its_hold_gets_exactly_its_shards_and_nobody_moves() -> None:
    g = three_static()
    before = {m: g.state.target_of(m) for m in ("w1", "w2", "w3")}
    leave_gracefully(g, "w1", "a1")
    assert "w1" not in g.state.members
    assert g.state.target_of("w1") == before["w1"]  # held for it
    assert not before["w1"] & set(g.state.owners)  # read by nobody meanwhile
    assert g.state.holds["w1"].until_ms == g.now + TIMING.lease_ttl_ms
    g.now += 2_000
    settle(g, {"w2": "a2", "w3": "a3"})
    assert {m: g.state.target_of(m) for m in ("w2", "w3")} == {m: before[m] for m in ("w2", "w3")}
    r = g.hb("w1", 0, incarnation="b1", static=True)  # the new process
    assert r.static is True
    assert r.assignment.assigned == before["w1"]  # at once: nobody holds them
    assert {m: g.state.target_of(m) for m in ("w1", "w2", "w3")} == before
    assert "w1" not in g.state.holds
    # the incarnation that left is over for good
    assert g.hb("w1", 3, incarnation="a1", static=True).fence_reason is FenceReason.REPLACED


def test_a_static_members_shards_move_when_its_hold_ends() -> None:
    g = three_static()
    leave_gracefully(g, "w1", "a1")
    held = g.state.target_of("w1")
    left_at = g.now
    while g.now < left_at + TIMING.lease_ttl_ms - 1:
        g.now = min(g.now + 1_000, left_at + TIMING.lease_ttl_ms - 1)
        settle(g, {"w2": "a2", "w3": "a3"}, rounds=1)
        g.tick()
    assert g.state.target_of("w1") == held
    g.now += 1
    assert [type(e) for e in g.tick()].count(HoldEnded) == 1
    assert "w1" not in g.state.target
    settle(g, {"w2": "a2", "w3": "a3"})
    assert {len(g.state.members[m].assigned) for m in ("w2", "w3")} == {6}


def test_the_hold_is_a_group_setting() -> None:
    g = three_static()
    g.run(ConfigureGroup(GroupConfig(static_hold_ms=60_000)))
    leave_gracefully(g, "w1", "a1")
    assert g.state.holds["w1"].until_ms == g.now + 60_000
    g.now += 1_000
    g.run(ConfigureGroup(GroupConfig(static_hold_ms=5_000), g.now))  # shorter: applies to it too
    assert g.state.holds["w1"].until_ms == g.now + 5_000
    g.run(ConfigureGroup(GroupConfig(static_hold_ms=60_000), g.now))  # longer: only later holds
    assert g.state.holds["w1"].until_ms == g.now + 5_000
    g.run(ConfigureGroup(GroupConfig(static_hold_ms=0), g.now))  # an operator ends it now
    assert "w1" not in g.state.holds
    assert "w1" not in g.state.target


def test_a_draining_shard_is_never_held() -> None:
    """A static member that stops while it reads a DRAINING shard (a scale-in under way): that
    shard goes to another member at once, so the scale-in (or a quiesce) does not wait a hold."""
    g = three_static(shards=6)
    draining = max(g.state.target_of("w1"))
    g.scale(6, 2)  # the same count: then mark one DRAINING by hand below
    layout = g.state.layout
    shards = tuple(
        attrs.evolve(sh, state=ShardState.DRAINING) if sh.index == draining else sh for sh in layout.shards
    )
    g.run(ApplyLayout(attrs.evolve(layout, metadata_version=3, shards=shards), g.now))
    settle(g, {"w1": "a1", "w2": "a2", "w3": "a3"})
    assert draining in g.state.target_of("w1")
    # its leave: the ACTIVE shards are revoked at once, the DRAINING one once its next owner is ready
    for _ in range(6):
        member = g.state.members.get("w1")
        if member is None:
            break
        if not member.installed:
            g.hb("w1", -1, incarnation="a1", static=True)
            continue
        owned, revoked = member.assigned, member.revoking
        g.hb("w1", member.member_epoch, owned, revoked, "a1", static=True, leaving=True)
        settle(g, {"w2": "a2", "w3": "a3"}, rounds=1)
    assert "w1" not in g.state.members
    assert draining not in g.state.target_of("w1")
    assert g.state.holds["w1"].static
    settle(g, {"w2": "a2", "w3": "a3"})
    assert draining in g.state.owners  # read on by another member


def test_an_operator_ends_a_hold_by_removing_the_member() -> None:
    g = three_static()
    leave_gracefully(g, "w1", "a1")
    g.run(RemoveMember("w1", g.now))
    assert "w1" not in g.state.holds
    assert "w1" not in g.state.target
    settle(g, {"w2": "a2", "w3": "a3"})
    assert set(g.state.owners) == set(range(12))


def test_a_crashed_static_member_is_held_from_its_lease_end() -> None:
    g = three_static()
    before = g.state.target_of("w1")
    for _ in range(TIMING.lease_ttl_ms // 1_000 + 1):
        g.now += 1_000
        settle(g, {"w2": "a2", "w3": "a3"}, rounds=1)
        g.tick()
    fenced = [e for e in g.events if isinstance(e, MemberFenced)]
    assert [(e.member_id, e.reason) for e in fenced] == [("w1", FenceReason.LEASE_EXPIRED)]
    assert g.state.holds["w1"].until_ms == fenced[0].fenced_at_ms + TIMING.lease_ttl_ms
    assert g.state.target_of("w1") == before
    assert not g.state.quarantine  # its lease has ended: it cannot be handling anything
    r = g.hb("w1", 0, incarnation="b1", static=True)
    assert r.assignment.assigned == before


def test_a_new_incarnation_takes_a_live_static_member_over_and_waits_out_the_old_lease() -> None:
    g = three_static()
    before = {m: g.state.target_of(m) for m in ("w1", "w2", "w3")}
    g.now += 500
    old_lease_end = g.leases["w1"]  # its last heartbeat (at 0) + the lease
    r = g.hb("w1", 0, incarnation="b1", static=True)  # kill -9 and an immediate restart
    assert r.status is HeartbeatStatus.REVOKE_PENDING
    assert r.assignment.pending == before["w1"]
    assert not r.assignment.assigned
    names = g.names()
    assert names[names.index("MemberFenced") - 2 :][:6] == [
        "ShardsReleased",
        "ShardsQuarantined",
        "MemberFenced",
        "AssignmentHeld",
        "MemberJoined",
        "MemberHeartbeated",
    ]
    fenced = next(e for e in g.events if isinstance(e, MemberFenced))
    assert (fenced.incarnation, fenced.reason) == ("a1", FenceReason.REPLACED)
    assert not before["w1"] & set(g.state.owners)  # the old owner tokens go at once
    # the old process is told it was replaced, whatever it sends
    for epoch in (0, 1, 2, -1):
        old = g.hb("w1", epoch, before["w1"], incarnation="a1", static=True)
        assert (old.status, old.fence_reason) == (HeartbeatStatus.FENCED, FenceReason.REPLACED)
    assert g.state.members["w1"].incarnation == "b1"
    # nothing is installed before the old incarnation's lease can have ended
    until = old_lease_end
    assert set(g.state.quarantine.values()) == {until}
    g.now = until - 1
    r = g.hb("w1", r.member_epoch, incarnation="b1", static=True)
    assert not r.assignment.assigned
    g.now = until
    r = g.hb("w1", r.member_epoch, incarnation="b1", static=True)
    assert r.assignment.assigned == before["w1"]
    assert any(isinstance(e, QuarantineEnded) for e in g.events)
    settle(g, {"w1": "b1", "w2": "a2", "w3": "a3"})
    assert {m: g.state.target_of(m) for m in ("w1", "w2", "w3")} == before


def test_without_a_lease_table_a_takeover_waits_a_whole_lease() -> None:
    """A decision that is not given the lease table (`rsc simulate`, tests) takes the safe side."""
    from rsc.events import group

    g = three_static()
    g.now += 500
    _, events = group.execute(g.state, Heartbeat("w1", "b1", 0, now_ms=g.now, static=True))
    (quarantine,) = [e for e in events if isinstance(e, ShardsQuarantined)]
    assert quarantine.until_ms == g.now + TIMING.lease_ttl_ms


def test_a_quarantine_ends_at_a_tick_too() -> None:
    g = three_static()
    g.hb("w1", 0, incarnation="b1", static=True)
    g.now += TIMING.lease_ttl_ms
    events = g.tick()
    assert any(isinstance(e, QuarantineEnded) for e in events)
    assert not g.state.quarantine


def test_two_live_processes_with_one_static_id_never_ping_pong() -> None:
    g = three_static()
    g.hb("w1", 0, incarnation="b1", static=True)
    # the older one rejoins with its own incarnation: refused for good
    r = g.hb("w1", 0, incarnation="a1", static=True)
    assert r.fence_reason is FenceReason.REPLACED
    assert g.state.members["w1"].incarnation == "b1"
    # a third process takes over from the second
    g.hb("w1", 0, incarnation="c1", static=True)
    assert g.state.superseded["w1"] == ("a1", "b1")
    for old in ("a1", "b1"):
        assert g.hb("w1", 0, incarnation=old, static=True).fence_reason is FenceReason.REPLACED


def test_a_member_that_is_not_static_is_still_refused_and_cannot_take_a_static_one_over() -> None:
    g = Group.create(shards=4)
    settle(g, {"m": "a"}, static=False)
    with pytest.raises(IncarnationMismatch):
        g.hb("m", 0, incarnation="b", static=True)  # it joined as not static
    g2 = Group.create(shards=4)
    settle(g2, {"m": "a"})
    with pytest.raises(IncarnationMismatch):
        g2.hb("m", 0, incarnation="b", static=False)  # the newcomer does not say static
    with pytest.raises(IncarnationMismatch):
        g2.hb("m", 3, incarnation="b", static=True)  # only a join takes over


def test_below_level_4_static_is_ignored_and_nothing_new_is_written() -> None:
    g = Group.create(shards=6)
    g.level = 3
    settle(g, {"w1": "a1", "w2": "a2"})
    assert not any(m.static for m in g.state.members.values())
    with pytest.raises(IncarnationMismatch):
        g.hb("w1", 0, incarnation="b1", static=True)
    assert (
        g.hb(
            "w2", g.state.members["w2"].member_epoch, g.state.members["w2"].assigned, incarnation="a2"
        ).static
        is None
    )
    g.hb("w1", -1, incarnation="a1", static=True)
    assert not g.state.holds
    assert "w1" not in g.state.target
    assert all(EVENT_LEVELS[type(e).__name__] <= 3 for e in g.events if e.durable)


def test_removing_a_live_member_quarantines_its_shards_for_a_lease() -> None:
    g = Group.create(shards=4)
    settle(g, {"a": "i", "b": "j"}, static=False)
    shards = g.state.members["a"].installed
    lease_end = g.leases["a"]
    g.now += 1_000
    g.run(RemoveMember("a", g.now))
    assert g.state.quarantine == dict.fromkeys(shards, lease_end)  # not a ms earlier, nor later
    settle(g, {"b": "j"}, static=False)
    assert not shards & g.state.members["b"].installed
    g.now = lease_end
    settle(g, {"b": "j"}, static=False)
    assert g.state.members["b"].installed == frozenset(range(4))


def test_a_member_that_is_not_static_gets_its_shards_back_on_a_quick_rejoin() -> None:
    g = Group.create(shards=12)
    ids = {"w1": "a1", "w2": "a2", "w3": "a3"}
    settle(g, ids, static=False)
    before = {m: g.state.target_of(m) for m in ids}
    # w2's shards go to the others while it restarts...
    m = g.state.members["w2"]
    g.hb("w2", m.member_epoch, m.assigned, incarnation="a2", leaving=True)
    for _ in range(4):
        settle(g, {"w1": "a1", "w3": "a3"}, static=False, rounds=1)
        m = g.state.members["w2"]
        g.hb("w2", m.member_epoch, m.assigned - m.revoking, m.revoking, incarnation="a2", leaving=True)
    g.hb("w2", -1, incarnation="a2")
    settle(g, {"w1": "a1", "w3": "a3"}, static=False)
    assert g.state.holds["w2"].shards == before["w2"]
    assert not g.state.holds["w2"].static
    assert {len(g.state.target_of(m)) for m in ("w1", "w3")} == {6}
    # ...and come back to it: nobody else's shard moved
    g.now += 1_000
    settle(g, {"w1": "a1", "w2": "b2", "w3": "a3"}, static=False)
    assert {m: g.state.target_of(m) for m in ids} == before
    assert "w2" not in g.state.holds  # served


def test_a_memory_is_forgotten_after_a_lease() -> None:
    g = Group.create(shards=4)
    settle(g, {"a": "i", "b": "j"}, static=False)
    g.hb("a", -1, incarnation="i")
    assert "a" in g.state.holds
    g.now += TIMING.lease_ttl_ms - 1
    settle(g, {"b": "j"}, static=False)
    g.tick()
    assert "a" in g.state.holds
    g.now += 1
    settle(g, {"b": "j"}, static=False)
    assert not g.state.holds
    assert any(isinstance(e, HoldEnded) for e in g.events)


def test_new_events_belong_to_level_4() -> None:
    for kind in (AssignmentHeld, HoldEnded, ShardsQuarantined, QuarantineEnded):
        assert EVENT_LEVELS[kind.__name__] == 4


def test_the_lease_table_of_a_batch_sees_what_its_earlier_commands_did() -> None:
    """An actor decides a batch's commands one after the other, and writes the lease table only
    once the batch is persisted: a takeover decided after the old incarnation's heartbeat in
    the same batch must see that heartbeat's lease, or it would wait too little."""
    from rsc.events.events import MemberHeartbeated, MemberLeft
    from rsc.events.liveness import BatchLeases, Leases

    table = Leases({"w1": 1_000, "w2": 2_000})
    view = BatchLeases(table)
    view.note([MemberHeartbeated("w1", 9_000)])
    assert view["w1"] == 9_000
    assert dict(table) == {"w1": 1_000, "w2": 2_000}  # the table itself waits for the write
    view.note([MemberLeft("w2", 3)])
    assert "w2" not in view
    assert dict(view) == {"w1": 9_000}
    assert len(view) == 1

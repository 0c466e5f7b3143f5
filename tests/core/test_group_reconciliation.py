"""Reconciliation scenarios, after Kafka's CurrentAssignmentBuilderTest and
GroupMetadataManagerTest, asserting the properties of our protocol."""

from __future__ import annotations

import attrs
import pytest

from rsc.events import group, reconcile
from rsc.events.commands import ConfigureGroup, CreateGroup, RemoveMember, RestartTimers, Tick
from rsc.events.errors import AggregateNotFound, IncarnationMismatch, InvalidCommand
from rsc.events.events import MemberFenced, ShardsInstalled, ShardsReleased, TargetAssignmentUpdated
from rsc.events.model import FenceReason, GroupConfig, HeartbeatStatus, MemberState
from rsc.events.versions import EVENT_LEVELS
from tests.groupkit import TIMING, Group, layout

OK = HeartbeatStatus.OK
PENDING = HeartbeatStatus.REVOKE_PENDING


def two_members_mid_handoff() -> tuple[Group, set[int], set[int]]:
    """a holds 0..5; b has joined and waits for a's revokes."""
    g = Group.create(shards=6)
    first = g.hb("a", 0)
    g.hb("a", first.member_epoch, owned=first.assignment.assigned)
    joined = g.hb("b", 0)
    return g, set(first.assignment.assigned), set(joined.assignment.pending)


def test_first_member_gets_every_shard_and_is_stable() -> None:
    g = Group.create(shards=6)
    r = g.hb("a", 0)
    assert r.status is OK
    assert r.assignment.assigned == frozenset(range(6))
    assert r.member_epoch == r.group_epoch == r.assignment_epoch == 1
    assert r.max_concurrency == 1
    assert g.state.member_state(g.state.members["a"]) is MemberState.STABLE


def test_stable_to_stable_changes_nothing_durable() -> None:
    g = Group.create()
    r = g.hb("a", 0)
    events = g.run(Tick(0, g.leases))
    again = g.hb("a", r.member_epoch, owned=r.assignment.assigned)
    assert again == attrs.evolve(r, layout=None)
    assert [e for e in events if e.durable] == []
    assert g.names()[-1] == "MemberHeartbeated"


def test_new_free_shards_are_installed_at_once() -> None:
    g = Group.create(shards=4)
    r = g.hb("a", 0)
    g.scale(6, version=2)
    r2 = g.hb("a", r.member_epoch, owned=r.assignment.assigned, metadata_version=1)
    assert r2.status is OK
    assert r2.assignment.assigned == frozenset(range(6))
    assert r2.member_epoch == 2
    assert r2.layout is not None
    assert r2.layout.metadata_version == 2


def test_member_that_must_revoke_keeps_old_epoch_and_gets_nothing_new() -> None:
    g, a_owned, _ = two_members_mid_handoff()
    r = g.hb("a", 1, owned=a_owned)
    assert r.status is PENDING
    assert r.member_epoch == 1  # not advanced to assignment epoch 2
    assert len(r.assignment.revoke) == 3
    assert r.assignment.assigned == frozenset(a_owned) - r.assignment.revoke
    assert r.assignment.pending == frozenset()
    assert g.state.member_state(g.state.members["a"]) is MemberState.UNREVOKED


def test_joiner_waits_for_unreleased_shards_then_takes_them() -> None:
    g, a_owned, b_pending = two_members_mid_handoff()
    b = g.hb("b", 2)
    assert b.status is PENDING
    assert b.member_epoch == 2
    assert b.assignment.assigned == frozenset()
    assert b.assignment.pending == frozenset(b_pending)
    a = g.hb("a", 1, owned=a_owned)
    assert a.assignment.revoke == frozenset(b_pending)
    # still unreleased: a has not acked
    assert g.hb("b", 2).assignment.assigned == frozenset()
    a2 = g.hb("a", 1, owned=a_owned - b_pending, revoked=b_pending)
    assert a2.status is OK
    assert a2.member_epoch == 2
    b2 = g.hb("b", 2)
    assert b2.status is OK
    assert b2.assignment.assigned == frozenset(b_pending)
    assert g.state.member_state(g.state.members["b"]) is MemberState.STABLE


def test_handoff_journal_order_is_ack_release_install() -> None:
    g, a_owned, b_pending = two_members_mid_handoff()
    g.hb("a", 1, owned=a_owned)
    g.hb("a", 1, owned=a_owned - b_pending, revoked=b_pending)
    g.hb("b", 2)
    durable = [n for n, e in zip(g.names(), g.events, strict=True) if e.durable]
    ack = durable.index("ShardsRevokeAcked")
    assert durable[ack : ack + 2] == ["ShardsRevokeAcked", "ShardsReleased"]
    installs = [i for i, e in enumerate(g.events) if isinstance(e, ShardsInstalled) and e.member_id == "b"]
    releases = [i for i, e in enumerate(g.events) if isinstance(e, ShardsReleased)]
    assert installs
    assert min(installs) > max(releases)


def test_revoke_is_acked_by_no_longer_reporting_the_shard() -> None:
    g, a_owned, b_pending = two_members_mid_handoff()
    g.hb("a", 1, owned=a_owned)
    a = g.hb("a", 1, owned=a_owned - b_pending)  # stopped reading, no explicit ack
    assert a.status is OK
    assert g.hb("b", 2).assignment.assigned == frozenset(b_pending)


def test_target_change_during_revoke() -> None:
    g, a_owned, _ = two_members_mid_handoff()
    revoke = g.hb("a", 1, owned=a_owned).assignment.revoke
    c = g.hb("c", 0)  # target changes while a is revoking
    assert c.assignment_epoch == 3
    a = g.hb("a", 1, owned=a_owned)
    assert a.status is PENDING
    assert revoke <= a.assignment.revoke  # earlier revokes still stand
    assert len(a.assignment.assigned) == 2  # quota 2 of 6 over three members
    keep = a.assignment.assigned
    a2 = g.hb("a", 1, owned=keep, revoked=a_owned - keep)
    assert a2.status is OK
    assert a2.member_epoch == 3
    b = g.hb("b", 2)
    c = g.hb("c", c.member_epoch)
    assert len(b.assignment.assigned) == len(c.assignment.assigned) == 2
    assert b.assignment.assigned.isdisjoint(c.assignment.assigned | keep)


def test_previous_epoch_with_a_subset_is_accepted() -> None:
    g = Group.create(shards=4)
    r = g.hb("a", 0)
    g.scale(6, version=2)
    r2 = g.hb("a", r.member_epoch, owned=r.assignment.assigned)
    # r2 was lost: the member heartbeats again with its previous epoch
    r3 = g.hb("a", r.member_epoch, owned=r.assignment.assigned)
    assert r3.status is OK
    assert r3.assignment == r2.assignment
    assert r3.member_epoch == r2.member_epoch


def test_previous_epoch_with_a_superset_is_fenced() -> None:
    g = Group.create(shards=4)
    r = g.hb("a", 0)
    g.scale(6, version=2)
    g.hb("a", r.member_epoch, owned=r.assignment.assigned)
    r3 = g.hb("a", r.member_epoch, owned={0, 1, 2, 3, 99})
    assert r3.status is HeartbeatStatus.FENCED
    assert r3.member_epoch == 0
    assert r3.fence_reason is FenceReason.STALE_EPOCH


@pytest.mark.parametrize("epoch", [7, 2])
def test_future_or_older_epoch_is_fenced(epoch: int) -> None:
    g = Group.create(shards=4)
    g.hb("a", 0)
    g.scale(5, version=2)
    g.hb("a", 1, owned=range(4))
    g.scale(6, version=3)
    g.hb("a", 2, owned=range(5))
    assert g.state.members["a"].member_epoch == 3
    r = g.hb("a", epoch if epoch != 2 else 1)
    assert r.status is HeartbeatStatus.FENCED
    # the member is not removed: rejoining with epoch 0 gives its shards back
    back = g.hb("a", 0)
    assert back.status is OK
    assert back.assignment.assigned == frozenset(range(6))


def test_leave_bumps_group_epoch_and_frees_shards_at_once() -> None:
    g, a_owned, b_pending = two_members_mid_handoff()
    g.hb("a", 1, owned=a_owned - b_pending, revoked=b_pending)
    b = g.hb("b", 2)
    before = g.state.group_epoch
    left = g.hb("a", -1)
    assert left.member_epoch == -1
    assert g.state.group_epoch == before + 1
    assert "a" not in g.state.members
    b2 = g.hb("b", b.member_epoch, owned=b.assignment.assigned)
    assert b2.assignment.assigned == frozenset(range(6))


def test_leave_of_an_unknown_member_is_answered_unknown() -> None:
    g = Group.create()
    assert g.hb("ghost", -1).status is HeartbeatStatus.UNKNOWN_MEMBER


def test_lease_expiry_fences_and_releases() -> None:
    g = Group.create(shards=4)
    a = g.hb("a", 0)
    g.now = 3_000
    g.hb("b", 0)
    events = g.tick(advance_ms=2_000)  # a last heard at 0, lease 5s
    assert any(isinstance(e, MemberFenced) and e.reason is FenceReason.LEASE_EXPIRED for e in events)
    assert "a" not in g.state.members
    assert g.state.owners == {}
    stale = g.hb("a", a.member_epoch, owned=a.assignment.assigned)
    assert stale.status is HeartbeatStatus.FENCED
    assert stale.fence_reason is FenceReason.LEASE_EXPIRED
    b = g.hb("b", g.state.members["b"].member_epoch)
    assert b.assignment.assigned == frozenset(range(4))


def test_heartbeats_keep_the_lease() -> None:
    g = Group.create()
    r = g.hb("a", 0)
    for _ in range(10):
        g.now += 4_000
        r = g.hb("a", r.member_epoch, owned=r.assignment.assigned)
        g.tick()
    assert "a" in g.state.members


def test_revoke_timeout_fences() -> None:
    g, a_owned, _ = two_members_mid_handoff()
    g.hb("a", 1, owned=a_owned)
    for _ in range(21):  # a keeps heartbeating but never acks
        g.now += 1_000
        g.hb("a", 1, owned=a_owned)
        g.hb("b", 2)
        g.tick()
    fenced = [e for e in g.events if isinstance(e, MemberFenced)]
    assert [(e.member_id, e.reason) for e in fenced] == [("a", FenceReason.REVOKE_TIMEOUT)]
    # a's lease had not ended: it may still be handling a's shards until it does (quarantine).
    quarantined = frozenset(g.state.quarantine)
    assert quarantined
    (until,) = set(g.state.quarantine.values())  # a's lease end: its last heartbeat + the lease
    assert fenced[0].fenced_at_ms < until <= fenced[0].fenced_at_ms + TIMING.lease_ttl_ms
    r = g.hb("b", g.state.members["b"].member_epoch)
    assert not r.assignment.assigned & quarantined
    assert r.assignment.pending == quarantined
    g.now = until - 1
    assert g.hb("b", r.member_epoch).assignment.pending == quarantined  # not one ms earlier
    g.now += 1
    assert g.hb("b", g.state.members["b"].member_epoch).assignment.assigned == frozenset(range(6))
    assert not g.state.quarantine


def test_due_ms_is_the_revoke_deadline_when_it_comes_before_the_lease_ends() -> None:
    """A driver sleeps until `due_ms`: it must be the revoke deadline itself, not a second late."""
    g, a_owned, _ = two_members_mid_handoff()
    g.hb("a", 1, owned=a_owned)
    deadline = g.state.members["a"].revoke_deadline_ms
    assert deadline is not None
    g.now = deadline - 100
    g.hb("a", 1, owned=a_owned)  # renewed: its lease now ends after the deadline
    g.hb("b", 2)
    assert group.due_ms(g.state, g.leases) == deadline
    assert group.decide(g.state, Tick(deadline - 1, g.leases), g.level, g.leases) == []
    fenced = [
        e
        for e in group.decide(g.state, Tick(deadline, g.leases), g.level, g.leases)
        if isinstance(e, MemberFenced)
    ]
    assert [(e.member_id, e.reason) for e in fenced] == [("a", FenceReason.REVOKE_TIMEOUT)]


def test_due_ms_is_when_the_assignment_interval_allows_a_new_target() -> None:
    g = Group.create(shards=8, timing=attrs.evolve(TIMING, assignment_interval_ms=1_000))
    g.hb("a", 0)
    g.now = 10
    g.hb("b", 0)  # the group epoch moves; the target waits for the interval
    assert g.state.group_epoch > g.state.assignment_epoch
    assert group.due_ms(g.state, g.leases) == 1_000  # a's target was computed at 0
    assert group.decide(g.state, Tick(999, g.leases), g.level, g.leases) == []
    assert any(
        isinstance(e, TargetAssignmentUpdated)
        for e in group.decide(g.state, Tick(1_000, g.leases), g.level, g.leases)
    )
    g.tick(advance_ms=990)
    assert group.due_ms(g.state, g.leases) == min(g.leases.values())  # now only the leases


def test_revoke_timeout_installs_at_once_below_level_4() -> None:
    """Below feature level 4 nothing is quarantined (what 0.1.0 does, and can replay)."""
    g, a_owned, _ = two_members_mid_handoff()
    g.level = 3
    g.hb("a", 1, owned=a_owned)
    for _ in range(21):
        g.now += 1_000
        g.hb("a", 1, owned=a_owned)
        g.hb("b", 2)
        g.tick()
    assert not g.state.quarantine
    assert g.hb("b", g.state.members["b"].member_epoch).assignment.assigned == frozenset(range(6))
    assert all(
        type(e).__name__ in EVENT_LEVELS and EVENT_LEVELS[type(e).__name__] <= 3
        for e in g.events
        if e.durable
    )


def test_restart_timers_gives_a_whole_lease() -> None:
    g = Group.create()
    g.hb("a", 0)
    g.now = 4_900
    g.run(RestartTimers(g.now))
    assert not any(isinstance(e, MemberFenced) for e in g.tick(advance_ms=4_000))
    assert any(isinstance(e, MemberFenced) for e in g.tick(advance_ms=1_000))


def test_another_incarnation_of_a_live_member_is_refused() -> None:
    g = Group.create()
    g.hb("a", 0)
    with pytest.raises(IncarnationMismatch):
        g.hb("a", 0, incarnation="inc-2")
    g.tick(advance_ms=5_000)
    assert g.hb("a", 0, incarnation="inc-2").status is OK


def test_unknown_member_with_an_epoch() -> None:
    g = Group.create()
    r = g.hb("nobody", 5)
    assert r.status is HeartbeatStatus.UNKNOWN_MEMBER
    assert r.member_epoch == 0
    assert [e.durable for e in g.events[1:]] == [False]


def test_sync_metadata_when_member_knows_a_newer_layout() -> None:
    g = Group.create()
    r = g.hb("a", 0, metadata_version=9)
    assert r.status is HeartbeatStatus.SYNC_METADATA
    assert r.layout == g.state.layout
    ok = g.hb("a", r.member_epoch, owned=r.assignment.assigned, metadata_version=1)
    assert ok.status is OK
    assert ok.layout is None


def test_max_concurrency_reaches_members() -> None:
    g = Group.create()
    r = g.hb("a", 0)
    g.run(ConfigureGroup(GroupConfig(max_concurrency=8)))
    assert g.state.group_epoch == 1  # not an assignment change
    assert g.hb("a", r.member_epoch, owned=r.assignment.assigned).max_concurrency == 8
    with pytest.raises(InvalidCommand):
        g.run(ConfigureGroup(GroupConfig(max_concurrency=0)))


def test_remove_member_fences_it() -> None:
    g = Group.create()
    g.hb("a", 0)
    g.run(RemoveMember("a", g.now))
    assert g.hb("a", 1).fence_reason is FenceReason.REMOVED
    with pytest.raises(AggregateNotFound):
        g.run(RemoveMember("a", g.now))


def test_assignment_interval_folds_bumps_into_one_computation() -> None:
    g = Group.create(shards=8, timing=attrs.evolve(TIMING, assignment_interval_ms=1_000))
    g.hb("a", 0)
    for m in "bcd":
        g.hb(m, 0)
    assert g.state.assignment_epoch == 1
    assert g.state.group_epoch == 4
    g.tick(advance_ms=1_000)
    assert g.state.assignment_epoch == 4
    assert {len(v) for v in g.state.target.values()} == {2}


@pytest.mark.parametrize(
    "bad", [{"member_epoch": -2}, {"owned": {-1}}, {"member": ""}, {"member": "x" * 300}]
)
def test_invalid_heartbeats_are_refused(bad: dict[str, object]) -> None:
    g = Group.create()
    args: dict[str, object] = {"member": "a", "epoch": bad.get("member_epoch", 0)}
    if "member" in bad:
        args["member"] = bad["member"]
    with pytest.raises(InvalidCommand):
        g.hb(args["member"], args["epoch"], owned=bad.get("owned", set()))  # type: ignore[arg-type]


def test_commands_before_creation_are_refused_and_creation_is_idempotent() -> None:
    with pytest.raises(AggregateNotFound):
        group.decide(None, Tick(0, {}))
    g = Group.create()
    assert group.decide(g.state, CreateGroup("orders", "billing", layout(3), TIMING)) == []


def test_worked_example_of_docs_protocol() -> None:
    """The table in docs/protocol.md, step by step."""
    g = Group.create(shards=6)
    durable = lambda events: [type(e).__name__ for e in events if e.durable]  # noqa: E731
    a = g.hb("a", 0)
    assert durable(g.events[-5:]) == [
        "MemberJoined",
        "TargetAssignmentUpdated",
        "MemberEpochAdvanced",
        "ShardsInstalled",
    ]
    assert (a.status, a.member_epoch, a.assignment.assigned) == (OK, 1, frozenset(range(6)))
    start = len(g.events)
    b = g.hb("b", 0)
    assert durable(g.events[start:]) == ["MemberJoined", "TargetAssignmentUpdated", "MemberEpochAdvanced"]
    assert (b.status, b.member_epoch, b.assignment.assigned, b.assignment.pending) == (
        PENDING,
        2,
        frozenset(),
        frozenset({3, 4, 5}),
    )
    a = g.hb("a", 1, owned=range(6))
    assert (a.status, a.member_epoch, a.assignment.assigned, a.assignment.revoke) == (
        PENDING,
        1,
        frozenset({0, 1, 2}),
        frozenset({3, 4, 5}),
    )
    assert g.hb("b", 2).assignment.pending == frozenset({3, 4, 5})
    start = len(g.events)
    a = g.hb("a", 1, owned={0, 1, 2}, revoked={3, 4, 5})
    assert durable(g.events[start:]) == ["ShardsRevokeAcked", "ShardsReleased", "MemberEpochAdvanced"]
    assert (a.status, a.member_epoch) == (OK, 2)
    start = len(g.events)
    b = g.hb("b", 2)
    assert durable(g.events[start:]) == ["ShardsInstalled"]
    assert (b.status, b.assignment.assigned) == (OK, frozenset({3, 4, 5}))


def test_a_large_group_folds_a_storm_into_one_computation_a_tick_makes() -> None:
    """Up to `LARGE_GROUP` members every join computes a target at once (the configured interval,
    0 here); past it, a join within a tenth of the heartbeat interval of the last computation
    waits, `due_ms` names the time, and the tick computes one target for the whole storm."""
    g = Group.create(shards=256)
    for i in range(reconcile.LARGE_GROUP):
        g.hb(f"m{i:03}", 0)
        assert g.state.assignment_epoch == g.state.group_epoch  # unchanged for a small group
    g.now = 10
    g.hb("late-1", 0)
    g.hb("late-2", 0)
    assert len(g.state.members) == reconcile.LARGE_GROUP + 2
    fold = TIMING.heartbeat_interval_ms // 10
    assert reconcile.assignment_interval_ms(g.state) == fold
    assert g.state.group_epoch == g.state.assignment_epoch + 2
    assert group.due_ms(g.state, g.leases) == fold  # the last computation was at 0
    assert not any(isinstance(e, TargetAssignmentUpdated) for e in g.tick(advance_ms=fold - 11))
    updated = [e for e in g.tick(advance_ms=1) if isinstance(e, TargetAssignmentUpdated)]
    assert len(updated) == 1
    assert g.state.assignment_epoch == g.state.group_epoch
    assert {"late-1", "late-2"} <= set(g.state.target)


def test_the_fold_is_capped_and_never_shortens_a_configured_interval() -> None:
    slow = Group.create(shards=256, timing=attrs.evolve(TIMING, heartbeat_interval_ms=30_000))
    for i in range(reconcile.LARGE_GROUP + 1):
        slow.hb(f"m{i:03}", 0)
    assert reconcile.assignment_interval_ms(slow.state) == reconcile.MAX_FOLD_MS
    configured = attrs.evolve(TIMING, assignment_interval_ms=2_000)
    g = Group.create(shards=256, timing=configured)
    for i in range(reconcile.LARGE_GROUP + 1):
        g.hb(f"m{i:03}", 0)
    assert reconcile.assignment_interval_ms(g.state) == 2_000

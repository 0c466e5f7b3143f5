"""A group recreated after Redis lost it (PROTOCOL: "During metadata correction the consumer
drains removed shards and receives REVOKE_PENDING until the conflicting previous owner is
released"): it learns the previous holders from what they report and hands their shards over
by the ordinary revoke -> release -> install; a shard nobody reported is installed to nobody
for one lease; a member that reports what someone else holds is told UNKNOWN_MEMBER."""

from __future__ import annotations

from rsc.events import group
from rsc.events.commands import CreateGroup
from rsc.events.model import HeartbeatStatus
from rsc.events.versions import STATIC_LEVEL
from tests.groupkit import TIMING, Group, layout

LEASE = TIMING.lease_ttl_ms
OK, PENDING, UNKNOWN = HeartbeatStatus.OK, HeartbeatStatus.REVOKE_PENDING, HeartbeatStatus.UNKNOWN_MEMBER


def rebuilt(shards: int = 6, level: int = STATIC_LEVEL + 3, now: int = 1_000) -> Group:
    command = CreateGroup("orders", "billing", layout(shards), TIMING, now_ms=now, rebuilt=True)
    state, events = group.execute(None, command, level)
    return Group(state, events, now=now, level=level)


def test_a_rebuilt_group_quarantines_every_shard_for_a_lease() -> None:
    g = rebuilt()
    assert g.names() == ["GroupCreated", "ShardsQuarantined"]
    assert g.state.quarantine == dict.fromkeys(range(6), 1_000 + LEASE)
    # a newcomer waits: REVOKE_PENDING with everything pending, nothing installed
    r = g.hb("c", 0)
    assert r.status is PENDING
    assert not r.assignment.assigned
    assert r.assignment.pending == frozenset(range(6))


def test_previous_holders_keep_their_shards_and_hand_over_by_revoke() -> None:
    g = rebuilt()
    a = g.hb("a", 37, owned={0, 1, 2}, incarnation="a-1")
    assert a.status in (OK, PENDING)
    assert g.state.members["a"].installed == {0, 1, 2}
    assert g.names()[-5:].count("ShardsInstalled") == 1
    b = g.hb("b", 41, owned={3, 4, 5}, incarnation="b-1")
    assert g.state.members["b"].installed == {3, 4, 5}
    assert b.status in (OK, PENDING)
    # nothing is quarantined any more: each shard's holder reported it
    assert not g.state.quarantined(g.now)
    # a third member joins: its shards come from a and b by revoke, it waits meanwhile
    g.now += 10
    c = g.hb("c", 0, incarnation="c-1")
    assert c.status is PENDING
    assert c.assignment.pending
    g.now += 10_000  # past the assignment interval: the target includes c
    a = g.hb("a", a.member_epoch, owned={0, 1, 2}, incarnation="a-1")
    b = g.hb("b", b.member_epoch, owned={3, 4, 5}, incarnation="b-1")
    c = g.hb("c", c.member_epoch, incarnation="c-1")
    revoked = a.assignment.revoke | b.assignment.revoke
    assert revoked, "a third member gets shards only through revokes"
    assert not revoked & c.assignment.assigned  # never installed before it is released
    a = g.hb(
        "a",
        a.member_epoch,
        owned={0, 1, 2} - a.assignment.revoke,
        revoked=a.assignment.revoke,
        incarnation="a-1",
    )
    b = g.hb(
        "b",
        b.member_epoch,
        owned={3, 4, 5} - b.assignment.revoke,
        revoked=b.assignment.revoke,
        incarnation="b-1",
    )
    c = g.hb("c", c.member_epoch, incarnation="c-1")
    assert c.assignment.assigned == revoked
    owners = [m.installed for m in g.state.members.values()]
    assert sum(len(s) for s in owners) == len(frozenset().union(*owners)) == 6


def test_a_shard_nobody_reported_waits_one_lease_from_the_rebuild() -> None:
    g = rebuilt(shards=4)
    a = g.hb("a", 5, owned={0, 1}, incarnation="a-1")  # 2 and 3: their holder never reports
    assert g.state.members["a"].installed == {0, 1}
    g.now += LEASE - 1
    a = g.hb("a", a.member_epoch, owned={0, 1}, incarnation="a-1")
    assert not {2, 3} & g.state.members["a"].installed
    assert a.status is PENDING
    g.now += 1  # one lease after the rebuild: whoever held them can no longer be handling them
    g.tick()
    a = g.hb("a", a.member_epoch, owned={0, 1}, incarnation="a-1")
    assert g.state.members["a"].installed == {0, 1, 2, 3}
    assert a.status is OK


def test_a_report_of_what_another_holds_or_of_a_free_shard_is_unknown_member() -> None:
    g = rebuilt(shards=4)
    g.hb("a", 5, owned={0, 1}, incarnation="a-1")
    assert g.hb("b", 9, owned={1, 2}, incarnation="b-1").status is UNKNOWN
    assert "b" not in g.state.members
    g.now += LEASE  # the quarantine is over: a late report takes nothing in
    g.tick()
    assert g.hb("b", 9, owned={2}, incarnation="b-1").status is UNKNOWN
    # nor does a member of a group that was never lost
    plain = Group.create(shards=4)
    assert plain.hb("a", 3, owned={0}).status is UNKNOWN


def test_below_level_4_a_rebuilt_group_is_as_before() -> None:
    g = rebuilt(level=STATIC_LEVEL - 1)
    assert g.names() == ["GroupCreated"]
    assert g.hb("a", 37, owned={0, 1}).status is UNKNOWN

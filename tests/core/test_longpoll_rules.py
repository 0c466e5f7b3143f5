"""The long-poll rules (`rsc.events.longpoll`), rechecks in the core, and the hold loop's
limits (`rsc.http.heartbeats.held.GroupChanges`) under trio's autojump clock."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from rsc.client.batching import BatchingTransport
from rsc.events import longpoll
from rsc.events.commands import Heartbeat
from rsc.events.errors import StaleRecheck
from rsc.events.events import QuarantineEnded, ShardsReleased, ShardsRevokeAcked, TargetAssignmentUpdated
from rsc.events.member_machine import MemberMachine, MemberSettings
from rsc.events.model import ClientInfo, HeartbeatStatus, ReleaseReason
from rsc.events.respond import respond
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from rsc.http.heartbeats.held import GroupChanges
from tests.groupkit import Group


def waiting(group: Group) -> tuple[HeartbeatResponse, HeartbeatResponse]:
    """a holds every shard and must revoke some; b waits for them."""
    a = group.hb("a", 0)
    group.hb("a", a.member_epoch, owned=a.assignment.assigned)
    b = group.hb("b", 0)
    a2 = group.hb("a", a.member_epoch, owned=a.assignment.assigned)
    assert a2.assignment.revoke
    assert b.assignment.pending == a2.assignment.revoke
    return a2, b


def request(
    member: str, epoch: int, wait_ms: int = 1_000, owned: frozenset[int] = frozenset()
) -> HeartbeatRequest:
    return HeartbeatRequest(1, "orders", "billing", member, "inc-1", epoch, 1, owned, wait_ms=wait_ms)


def test_only_an_answer_that_only_says_wait_is_held() -> None:
    g = Group.create(shards=4)
    _, b = waiting(g)
    assert longpoll.should_hold(request("b", b.member_epoch), b)
    assert not longpoll.should_hold(request("b", b.member_epoch, wait_ms=0), b)
    assert not longpoll.should_hold(request("b", b.member_epoch - 1), b)  # its epoch moved
    more = attrs.evolve(b, assignment=attrs.evolve(b.assignment, assigned=frozenset({9})))
    assert not longpoll.should_hold(request("b", b.member_epoch), more)  # something new to start
    ok = attrs.evolve(b, status=HeartbeatStatus.OK)
    assert not longpoll.should_hold(request("b", b.member_epoch), ok)


def test_what_concerns_a_held_heartbeat() -> None:
    change = longpoll.change_of([ShardsReleased("a", frozenset({2}), ReleaseReason.REVOKE_ACKED)])
    assert change is not None
    assert longpoll.concerns(change, "b", frozenset({2, 3}))
    assert not longpoll.concerns(change, "b", frozenset({3}))
    retarget = longpoll.change_of([TargetAssignmentUpdated(5, {"c": frozenset({1})}, 0)])
    assert retarget is not None
    assert longpoll.concerns(retarget, "c", frozenset())
    assert not longpoll.concerns(retarget, "b", frozenset({1}))
    assert longpoll.change_of([ShardsRevokeAcked("a", frozenset({2}))]) is None
    # A quarantine's end makes its shards installable: a member waiting for them is asked again.
    unquarantined = longpoll.change_of([QuarantineEnded(frozenset({3}))])
    assert unquarantined is not None
    assert longpoll.concerns(unquarantined, "b", frozenset({3}))
    # A target that moves quiet members (level 8): next owners may be ready, so a member
    # waiting for them (nothing pending) is asked again; one waiting for shards is not.
    assert longpoll.change_of([TargetAssignmentUpdated(6, {}, 0)]) is None
    quiet = longpoll.change_of([TargetAssignmentUpdated(6, {}, 0, advances=True)])
    assert quiet is not None
    assert longpoll.concerns(quiet, "b", frozenset())
    assert not longpoll.concerns(quiet, "b", frozenset({1}))


def test_a_recheck_never_acknowledges_and_is_refused_once_the_member_moved_on() -> None:
    g = Group.create(shards=4)
    a, _ = waiting(g)
    moving = a.assignment.revoke
    recheck = Heartbeat("a", "inc-1", a.member_epoch, g.now, 1, owned=frozenset(), recheck=True)
    events = g.run(recheck)  # reports nothing owned: a plain heartbeat would acknowledge
    assert not any(isinstance(e, ShardsRevokeAcked | ShardsReleased) for e in events)
    assert g.state.members["a"].revoking == moving
    with pytest.raises(StaleRecheck):
        g.run(attrs.evolve(recheck, member_epoch=a.member_epoch + 7))
    with pytest.raises(StaleRecheck):
        g.run(attrs.evolve(recheck, member_id="nobody"))


def test_again_is_a_recheck_at_the_latest_epoch() -> None:
    g = Group.create(shards=4)
    _, b = waiting(g)
    command = Heartbeat("b", "inc-1", 0, 5, 1, revoked=frozenset({1}))
    again = longpoll.again(command, b, 9)
    assert (again.member_epoch, again.revoked, again.now_ms, again.recheck) == (
        b.member_epoch,
        frozenset(),
        9,
        True,
    )


def test_a_long_interval_never_asks_for_more_than_the_wire_allows() -> None:
    machine = MemberMachine("s", "g", "m", "i", ClientInfo(), MemberSettings(heartbeat_interval_ms=90_000))
    first = machine.request(0)
    g = Group.create(shards=4)
    _, b = waiting(g)
    machine.receive(first, attrs.evolve(b, heartbeat_interval_ms=90_000, lease_ttl_ms=300_000), 0)
    assert machine.request(0).wait_ms == 60_000


async def held_answer(changes: GroupChanges) -> tuple[HeartbeatResponse, float]:
    g = Group.create(shards=4)
    _, b = waiting(g)
    body = request("b", b.member_epoch)
    command = body.to_command(g.now)

    async def decide(again: Heartbeat) -> HeartbeatResponse:
        events = g.run(again)
        return respond(g.state, again, events)

    start = trio.current_time()
    answer = await changes.hold(body, command, b, changes.version("orders", "billing"), decide)
    return answer, trio.current_time() - start


async def test_a_hold_ends_at_its_wait(autojump_clock: trio.testing.MockClock) -> None:
    answer, took = await held_answer(GroupChanges(lambda: 0))
    assert took == pytest.approx(1.0)
    assert answer.status is HeartbeatStatus.REVOKE_PENDING


async def test_beyond_the_limit_nothing_is_held(autojump_clock: trio.testing.MockClock) -> None:
    _, took = await held_answer(GroupChanges(lambda: 0, limit=0))
    assert took == 0


async def test_release_all_answers_every_held_heartbeat_now(autojump_clock: trio.testing.MockClock) -> None:
    changes = GroupChanges(lambda: 0)
    async with trio.open_nursery() as nursery:
        took: list[float] = []

        async def one() -> None:
            took.append((await held_answer(changes))[1])

        nursery.start_soon(one)
        await trio.sleep(0.25)
        assert changes.held == 1
        changes.release_all()
    assert took == [pytest.approx(0.25)]
    assert (await held_answer(changes))[1] == 0  # and nothing more is held


async def test_a_process_holds_at_most_max_long_polls_connections(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Beyond the cap a long poll travels batched without asking to wait."""

    class Recording:
        def __init__(self) -> None:
            self.single: list[int] = []
            self.batched: list[int] = []

        async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
            self.single.append(request.wait_ms)
            await trio.sleep(1)  # held
            return answer

        async def heartbeats(self, requests: list[HeartbeatRequest]) -> list[HeartbeatResponse]:
            self.batched.extend(r.wait_ms for r in requests)
            return [answer for _ in requests]

    g = Group.create(shards=4)
    _, answer = waiting(g)
    coordinator = Recording()
    transport = BatchingTransport(coordinator, max_long_polls=1)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(transport.run)
        async with trio.open_nursery() as polls:
            for member in ("b", "c"):
                polls.start_soon(transport.heartbeat, request(member, 1))
        nursery.cancel_scope.cancel()
    assert (coordinator.single, coordinator.batched) == ([1_000], [0])


async def test_a_revoke_acknowledgement_does_not_linger_for_company(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Interval heartbeats wait `linger_s` for each other; one acknowledging a revoke goes at
    once (another member waits for its shards), taking along what was waiting to go."""

    class Recording:
        def __init__(self) -> None:
            self.sent: list[tuple[float, list[str]]] = []

        async def heartbeats(self, requests: list[HeartbeatRequest]) -> list[HeartbeatResponse]:
            self.sent.append((trio.current_time(), [r.member_id for r in requests]))
            return [answer for _ in requests]

    g = Group.create(shards=4)
    _, answer = waiting(g)
    coordinator = Recording()
    transport = BatchingTransport(coordinator, linger_s=1.0)  # type: ignore[arg-type]
    start = trio.current_time()

    async def ack_later() -> None:
        await trio.sleep(0.25)
        acked = attrs.evolve(request("a", 1, wait_ms=0), revoked_shards=frozenset({3}))
        await transport.heartbeat(acked)

    async with trio.open_nursery() as nursery:
        await nursery.start(transport.run)
        async with trio.open_nursery() as beats:
            beats.start_soon(transport.heartbeat, request("b", 1, wait_ms=0))
            beats.start_soon(ack_later)
        await trio.sleep(2)
        beats_alone = [(when - start, who) for when, who in coordinator.sent]
        nursery.cancel_scope.cancel()
    assert beats_alone == [(pytest.approx(0.25), ["b", "a"])]
    # without an acknowledgement, the same two wait out the linger together
    coordinator.sent.clear()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(transport.run)
        async with trio.open_nursery() as beats:
            beats.start_soon(transport.heartbeat, request("b", 1, wait_ms=0))
            beats.start_soon(transport.heartbeat, request("a", 1, wait_ms=0))
        nursery.cancel_scope.cancel()
    assert [(when - start, sorted(who)) for when, who in coordinator.sent] == [
        (pytest.approx(1.0), ["a", "b"])
    ]


def stable_pair(g: Group) -> tuple[HeartbeatResponse, HeartbeatResponse]:
    """a and b each read two of four shards, reconciled."""
    a = g.hb("a", 0)
    b = g.hb("b", 0)
    for _ in range(3):
        a = g.hb("a", a.member_epoch, owned=a.assignment.assigned, revoked=a.assignment.revoke)
        b = g.hb("b", b.member_epoch, owned=b.assignment.assigned)
    assert (a.status, b.status) == (HeartbeatStatus.OK, HeartbeatStatus.OK)
    assert len(a.assignment.assigned) == len(b.assignment.assigned) == 2
    return a, b


def test_a_leaving_member_keeps_reading_until_the_next_owner_is_ready() -> None:
    g = Group.create(shards=4)
    a, b = stable_pair(g)
    mine = a.assignment.assigned
    command = Heartbeat("a", "inc-1", a.member_epoch, g.now, 1, owned=mine, leaving=True)
    events = g.run(command)
    answer = respond(g.state, command, events)
    assert g.state.members["a"].leaving
    assert g.state.target_of("a") == frozenset()
    assert g.state.target_of("b") == frozenset(range(4))
    # b has not heard of its new target yet: a is not asked to revoke, and keeps reading
    assert (answer.status, answer.assignment.assigned, answer.assignment.revoke) == (
        HeartbeatStatus.REVOKE_PENDING,
        mine,
        frozenset(),
    )
    again = attrs.evolve(request("a", answer.member_epoch, owned=mine), leaving=True)
    assert longpoll.should_hold(again, answer)  # its next heartbeat waits for the handover
    b2 = g.hb("b", b.member_epoch, owned=b.assignment.assigned)
    assert b2.assignment.pending == mine  # b is ready: it waits for them (in a long poll)
    advanced = longpoll.change_of(g.events[-3:])
    assert advanced is not None
    assert longpoll.concerns(advanced, "a", frozenset())  # wakes a's held heartbeat
    a2 = g.hb("a", answer.member_epoch, owned=mine)
    assert a2.assignment.revoke == mine  # now it hands them over
    a3 = g.hb("a", a2.member_epoch, owned=frozenset(), revoked=mine)
    assert a3.status is HeartbeatStatus.OK
    assert g.hb("b", b2.member_epoch, owned=b.assignment.assigned).assignment.assigned == frozenset(range(4))
    assert g.hb("a", -1).member_epoch == -1

"""The member runtime under trio's autojump clock, against the real core in process."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rsc.client.errors import CoordinatorRejected, CoordinatorUnintelligible
from rsc.client.member import Member, MemberSettings
from rsc.events.commands import ConfigureGroup
from rsc.events.model import GroupConfig, HeartbeatStatus
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from tests.clientkit import LocalCoordinator, Recorder

Clock = trio.testing.MockClock
Log = list[tuple[float, str, str, frozenset[int]]]


def never_overlapping(log: Log) -> None:
    """Replaying the lifecycle calls in time order, no shard is ever read by two members."""
    reading: dict[int, str] = {}
    for _, name, what, shards in sorted(log, key=lambda e: e[0]):
        for shard in shards:
            if what == "assigned":
                assert shard not in reading, f"{name} started {shard} while {reading.get(shard)} read it"
                reading[shard] = name
            elif reading.get(shard) == name:
                del reading[shard]


def member(coordinator: LocalCoordinator, name: str, log: Log) -> tuple[Member, Recorder]:
    recorder = Recorder(name, log)
    return Member(coordinator, "s", "g", name, recorder, incarnation=f"{name}-1"), recorder


async def test_members_hand_shards_over_without_overlap(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    a, ra = member(coordinator, "a", log)
    b, rb = member(coordinator, "b", log)
    ra.revoke_delay = 0.3  # in-flight work to finish before the ack
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await trio.sleep(3)
        assert ra.reading == set(range(6))
        await nursery.start(b.run)
        await trio.sleep(5)
        assert len(ra.reading) == len(rb.reading) == 3
        assert a.status is b.status is HeartbeatStatus.OK
        nursery.cancel_scope.cancel()
    never_overlapping(log)
    moved = next(shards for _, name, what, shards in log if name == "b" and what == "assigned")
    revoked_at = max(t for t, name, what, s in log if name == "a" and what == "revoke" and s & moved)
    assigned_at = min(t for t, name, what, s in log if name == "b" and what == "assigned")
    assert revoked_at < assigned_at


async def test_graceful_leave_moves_shards_at_once(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    a, ra = member(coordinator, "a", log)
    b, rb = member(coordinator, "b", log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await nursery.start(b.run)
        await trio.sleep(5)
        b.stop()
        left = trio.current_time()
        await b.wait_left()
        await trio.sleep(2.5)  # well under the 5 s lease
        assert ra.reading == set(range(6))
        assert "b" not in coordinator.state.members
        nursery.cancel_scope.cancel()
    assert rb.reading == set()
    assert any(what == "revoke" and t >= left for t, name, what, _ in log if name == "b")
    never_overlapping(log)


async def test_a_partitioned_member_fences_itself_before_its_shards_move(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    a, ra = member(coordinator, "a", log)
    b, rb = member(coordinator, "b", log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await nursery.start(b.run)
        await trio.sleep(5)
        held = frozenset(ra.reading)
        assert held
        coordinator.partitioned.add("a")
        await trio.sleep(8)  # past a's lease: the coordinator fences a, b takes everything
        assert rb.reading == set(range(6))
        assert a.self_fenced == 1
        nursery.cancel_scope.cancel()
    lost_at = next(t for t, name, what, _ in log if name == "a" and what == "lost")
    taken_at = min(t for t, name, what, s in log if name == "b" and what == "assigned" and s & held)
    assert lost_at < taken_at
    never_overlapping(log)


async def test_a_fenced_member_drops_everything_and_rejoins(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    a, ra = member(coordinator, "a", log)
    b, rb = member(coordinator, "b", log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await nursery.start(b.run)
        await trio.sleep(5)
        coordinator.partitioned.add("a")
        await trio.sleep(7)
        coordinator.partitioned.discard("a")
        await trio.sleep(8)
        assert "a" in coordinator.state.members
        assert len(ra.reading) == len(rb.reading) == 3
        nursery.cancel_scope.cancel()
    kinds = [what for _, name, what, _ in sorted(log, key=lambda e: e[0]) if name == "a"]
    assert kinds[0] == "assigned"
    assert "lost" in kinds
    assert kinds[-1] == "assigned"  # back in after rejoining with epoch 0
    never_overlapping(log)


async def test_sync_metadata_adopts_the_stored_layout(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    a, _ = member(coordinator, "a", log)
    a.machine.metadata_version = 9  # it knew a layout the coordinator no longer has
    await a.beat()
    assert a.status is HeartbeatStatus.SYNC_METADATA
    assert a.machine.metadata_version == 1
    assert a.request().metadata_version == 1
    await a.beat()
    assert a.status is HeartbeatStatus.OK


async def test_max_concurrency_changes_reach_the_lifecycle(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    a, ra = member(coordinator, "a", log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await trio.sleep(2)
        coordinator.run(ConfigureGroup(GroupConfig(max_concurrency=4)))
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert ra.workers == [1, 4]


class Faulty:
    """The local coordinator behind a fault: `mode` "500" answers 500 without processing the
    heartbeat, "garbled" processes it and answers something this client cannot read."""

    def __init__(self, coordinator: LocalCoordinator) -> None:
        self.coordinator = coordinator
        self.mode: str | None = None

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        if self.mode == "500":
            await trio.sleep(0.005)
            raise CoordinatorRejected(500, "INTERNAL", "boom")
        response = await self.coordinator.heartbeat(request)
        if self.mode == "garbled":
            raise CoordinatorUnintelligible("the coordinator's answer does not match HeartbeatResponse")
        return response


async def test_5xx_answers_are_failed_heartbeats_retried_within_the_lease(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    faulty = Faulty(coordinator)
    recorder = Recorder("a", log)
    a = Member(faulty, "s", "g", "a", recorder, incarnation="a-1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await trio.sleep(2)
        assert recorder.reading == set(range(6))
        faulty.mode = "500"
        sent = coordinator.requests
        await trio.sleep(2.5)  # well under the 4 s self-fence point of the 5 s lease
        faulty.mode = None
        await trio.sleep(2)
        assert recorder.reading == set(range(6))
        assert a.self_fenced == 0
        assert a.status is HeartbeatStatus.OK
        faulty.mode = "500"
        await trio.sleep(6)  # past the lease: it stops everything by itself, and does not crash
        assert recorder.reading == set()
        assert a.self_fenced == 1
        faulty.mode = None
        await trio.sleep(3)
        assert recorder.reading == set(range(6))  # back in
        nursery.cancel_scope.cancel()
    assert coordinator.requests > sent


async def test_answers_it_cannot_read_make_it_leave_so_that_its_shards_move(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    faulty = Faulty(coordinator)
    ra = Recorder("a", log)
    a = Member(faulty, "s", "g", "a", ra, incarnation="a-1")
    b, rb = member(coordinator, "b", log)
    gave_up: list[tuple[float, BaseException]] = []

    async def run_a(task_status: trio.TaskStatus[None]) -> None:
        try:
            await a.run(task_status=task_status)
        except CoordinatorUnintelligible as exc:
            gave_up.append((trio.current_time(), exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(run_a)
        await nursery.start(b.run)
        await trio.sleep(3)
        assert len(ra.reading) == len(rb.reading) == 3
        faulty.mode = "garbled"  # the coordinator still reads a's heartbeats and renews its lease
        started = trio.current_time()
        await trio.sleep(10)
        assert gave_up, "it should have given up"
        at, exc = gave_up[0]
        assert at - started <= 5 + 1  # within a lease (and a heartbeat)
        assert "leaving the group so that its shards move" in str(exc)
        assert ra.reading == set()
        assert "a" not in coordinator.state.members  # it left
        assert rb.reading == set(range(6))
        nursery.cancel_scope.cancel()
    never_overlapping(log)


async def test_a_revoke_longer_than_the_lease_keeps_heartbeating(autojump_clock: Clock) -> None:
    coordinator, log = LocalCoordinator(), []
    a, ra = member(coordinator, "a", log)
    b, rb = member(coordinator, "b", log)
    ra.revoke_delay = 7.0  # in-flight work longer than the 5 s lease (within the 10 s revoke timeout)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await trio.sleep(3)
        await nursery.start(b.run)
        await trio.sleep(6)  # a revokes; it keeps its lease meanwhile and b gets nothing yet
        assert a.self_fenced == 0
        assert "a" in coordinator.state.members
        assert ra.valid_until > trio.current_time()
        assert rb.reading == set()
        await trio.sleep(8)
        assert len(ra.reading) == len(rb.reading) == 3
        nursery.cancel_scope.cancel()
    never_overlapping(log)


async def test_a_graceful_leave_keeps_heartbeating_while_in_flight_work_finishes(
    autojump_clock: Clock,
) -> None:
    coordinator, log = LocalCoordinator(), []
    a, ra = member(coordinator, "a", log)
    b, rb = member(coordinator, "b", log)
    ra.revoke_delay = 7.0  # longer than the 5 s lease
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await trio.sleep(2)
        a.stop()
        await trio.sleep(6)  # still revoking: still a member, its lease renewed meanwhile
        assert "a" in coordinator.state.members
        assert ra.valid_until > trio.current_time()
        await nursery.start(b.run)
        await a.wait_left()
        await trio.sleep(2)
        assert "a" not in coordinator.state.members
        assert "a" not in coordinator.state.fenced  # it left; it was not fenced
        assert rb.reading == set(range(6))
        nursery.cancel_scope.cancel()
    assert a.self_fenced == 0
    never_overlapping(log)


async def handoff_gap(long_poll: bool) -> float:
    """Trio seconds from a's revoke ack to b's start of a moved shard (heartbeat interval 1 s)."""
    coordinator, log = LocalCoordinator(), []
    coordinator.long_poll = long_poll
    settings = MemberSettings(heartbeat_interval_ms=1_000, long_poll=long_poll)
    ra, rb = Recorder("a", log), Recorder("b", log)
    a = Member(coordinator, "s", "g", "a", ra, incarnation="a-1", settings=settings)
    b = Member(coordinator, "s", "g", "b", rb, incarnation="b-1", settings=settings)
    ra.revoke_delay = 0.1  # a short revoke: b hears of it at its next interval, ~0.4 s later
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await trio.sleep(2.5)
        await nursery.start(b.run)
        await trio.sleep(5)
        assert len(ra.reading) == len(rb.reading) == 3
        nursery.cancel_scope.cancel()
    never_overlapping(log)
    revoked_at = max(t for t, name, what, _ in log if name == "a" and what == "revoke")
    assigned_at = max(t for t, name, what, _ in log if name == "b" and what == "assigned")
    return assigned_at - revoked_at


async def test_a_waiting_member_gets_a_released_shard_within_a_round_trip(autojump_clock: Clock) -> None:
    """The long poll: b's heartbeat is held while its shards are pending and answered once a
    releases them, instead of b hearing of them at its next interval."""
    assert await handoff_gap(long_poll=True) < 0.05  # a's ack and b's answer: two round trips
    assert await handoff_gap(long_poll=False) > 0.2  # interval-only: wherever b's interval falls


async def test_a_long_poll_is_not_faster_polling_against_a_coordinator_that_does_not_hold(
    autojump_clock: Clock,
) -> None:
    """An older coordinator ignores `waitMs` and answers at once: the member still heartbeats
    once per interval while it waits, not in a loop."""
    coordinator, log = LocalCoordinator(), []
    coordinator.long_poll = False
    a, ra = member(coordinator, "a", log)
    b, rb = member(coordinator, "b", log)
    ra.revoke_delay = 4.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.ticks)
        await nursery.start(a.run)
        await trio.sleep(2)
        await nursery.start(b.run)
        await trio.sleep(0.5)
        before = coordinator.requests
        await trio.sleep(3)  # b waits for pending shards; a revokes (acks once)
        assert b.machine.pending or rb.reading
        assert coordinator.requests - before <= 8  # ~3 each at 1 s, plus acks
        nursery.cancel_scope.cancel()


async def test_a_refusal_leaves_run_as_itself_not_as_an_exception_group(autojump_clock: Clock) -> None:
    """`run` raises the refusal (the demo and the worker catch `RscError`)."""

    class Refusing:
        async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
            raise CoordinatorRejected(401, "UNAUTHENTICATED", "no credential")

    a = Member(Refusing(), "s", "g", "a", Recorder("a", []), incarnation="a-1")
    with pytest.raises(CoordinatorRejected, match="no credential"):
        await a.run()

"""The member runtime under trio's autojump clock, against the real core in process."""

from __future__ import annotations

import trio
import trio.testing

from rsc.client.member import Member
from rsc.events.commands import ConfigureGroup
from rsc.events.model import GroupConfig, HeartbeatStatus
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
    a.metadata_version = 9  # it knew a layout the coordinator no longer has
    await a.beat()
    assert a.status is HeartbeatStatus.SYNC_METADATA
    assert a.metadata_version == 1
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

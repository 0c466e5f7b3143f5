"""Actors on fakes, under trio's autojump clock: time-driven behaviour, group
commit, replies only after persistence, conflicts, recovery, idle stop."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from rsc.actors import admin_changes
from rsc.actors.actor import Actor, ActorSettings, fold_loaded
from rsc.actors.aggregates import GroupAggregate
from rsc.actors.clock import TrioClock
from rsc.actors.effects.memory_effects import MemoryEffects
from rsc.actors.errors import ActorStopped, StoreUnavailable
from rsc.actors.keys import AggregateId
from rsc.actors.store import MemoryStore
from rsc.events import group
from rsc.events.commands import ChangeShardCount, ConfigureGroup, CreateGroup, DeleteGroup
from rsc.events.errors import IncarnationMismatch, PreconditionFailed, UnknownGroup, UnknownStream
from rsc.events.events import GroupConfigured
from rsc.events.model import FenceReason, GroupConfig, HeartbeatStatus
from rsc.events.versions import GROUP_OPS_LEVEL
from tests.actorkit import SETTINGS, TIMING, Member, registry_on
from tests.groupkit import layout

# Every test takes `autojump_clock` (pytest-trio): time is virtual and jumps when all tasks wait.
Clock = trio.testing.MockClock


async def journal_state(store: MemoryStore, stream: str, name: str) -> group.GroupState | None:
    aggregate = GroupAggregate(AggregateId(stream, name), MemoryEffects())
    return fold_loaded(aggregate, await store.load(aggregate.aggregate_id))


async def test_first_join_creates_stream_and_group(autojump_clock: Clock) -> None:
    store, effects = MemoryStore(), MemoryEffects()
    async with registry_on(store, effects) as registry:
        a = Member(registry, "orders", "billing", "a")
        r = await a.heartbeat()
        assert r.status is HeartbeatStatus.OK
        assert r.assignment.assigned == frozenset(range(6))
    assert effects.registered == {"orders"}
    assert len({key for key, g in effects.consumer_groups if g == "billing"}) == 6
    assert set(effects.consumer_groups.values()) == {"0"}
    assert {t.member_id for t in effects.tokens.values()} == {"a"}


async def test_lease_expiry_fences_a_silent_member(autojump_clock: Clock) -> None:
    async with registry_on() as registry:
        a = Member(registry, "orders", "billing", "a")
        b = Member(registry, "orders", "billing", "b")
        await a.heartbeat()
        await b.heartbeat()
        for _ in range(8):  # b keeps heartbeating, a is silent
            await trio.sleep(1)
            await b.heartbeat()
        state = (await registry.group("orders", "billing")).state
        assert state is not None
        assert set(state.members) == {"b"}
        assert state.fenced["a"].reason is FenceReason.LEASE_EXPIRED
        assert b.owned == frozenset(range(6))
        assert (await a.heartbeat()).status is HeartbeatStatus.FENCED


async def test_revoke_timeout_fences_a_member_that_never_acks(autojump_clock: Clock) -> None:
    async with registry_on() as registry:
        a = Member(registry, "orders", "billing", "a")
        b = Member(registry, "orders", "billing", "b")
        await a.heartbeat()
        await b.heartbeat()
        started = trio.current_time()
        while (r := await a.heartbeat(ack=False)).status is not HeartbeatStatus.FENCED:
            await trio.sleep(1)
            await b.heartbeat()
        waited = trio.current_time() - started
        assert r.fence_reason is FenceReason.REVOKE_TIMEOUT
        assert TIMING.revoke_timeout_ms / 1000 <= waited <= TIMING.revoke_timeout_ms / 1000 + 2
        # a's lease had not ended when it was fenced: its shards wait one lease (quarantine).
        await b.heartbeat()
        assert b.owned != frozenset(range(6))
        fenced_at = trio.current_time()
        while b.owned != frozenset(range(6)):
            await trio.sleep(0.25)
            await b.heartbeat()
        # until a's lease ended: its last heartbeat (at most a second before the fence) + the lease
        assert trio.current_time() - fenced_at >= TIMING.lease_ttl_ms / 1000 - 1.5


async def test_group_commit_many_concurrent_commands_few_writes(autojump_clock: Clock) -> None:
    store = MemoryStore()
    async with registry_on(store) as registry:
        await Member(registry, "orders", "billing", "m000").heartbeat()
        before = store.appends
        responses = []

        async def join(i: int) -> None:
            responses.append(await Member(registry, "orders", "billing", f"m{i:03}").heartbeat())

        async with trio.open_nursery() as nursery:
            for i in range(1, 100):
                nursery.start_soon(join, i)
        writes = store.appends - before
        actor = await registry.group("orders", "billing")
        assert len(responses) == 99
        assert actor.state is not None
        assert len(actor.state.members) == 100
        assert writes <= 5  # 99 joins, a handful of batches
        replayed = await journal_state(store, "orders", "billing")
        assert replayed is not None
        assert replayed == actor.state


async def test_checkpoints_come_once_the_events_since_weigh_as_much_as_the_last(
    autojump_clock: Clock,
) -> None:
    """A large state is not rewritten every `checkpoint_every` events: the next checkpoint waits
    until the events written since weigh (bytes) as much as the last one, and for at least
    `checkpoint_every` of them; what a reload folds is the state all the same."""
    store = MemoryStore()
    async with registry_on(store) as registry:
        members = [Member(registry, "orders", "billing", f"m{i:03}") for i in range(30)]
        for _ in range(8):  # joins, then handoffs: every round writes events
            for member in members:
                await member.heartbeat()
        actor = await registry.group("orders", "billing")
        assert actor.state is not None
        entries = store.aggregates[AggregateId("orders", "billing")].entries
        marks = [i for i, e in enumerate(entries) if e.is_checkpoint]
        assert len(marks) >= 2  # the test writes enough for the rule to show
        for before, after in itertools.pairwise(marks):
            between = [e for e in entries[before + 1 : after] if not e.is_checkpoint]
            assert len(between) >= SETTINGS.actor.checkpoint_every
            assert sum(len(e.data) for e in between) >= len(entries[before].data)
        assert await journal_state(store, "orders", "billing") == actor.state


class GatedStore(MemoryStore):
    """Appends wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()

    async def append(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        await self.gate.wait()
        return await super().append(*args, **kwargs)  # type: ignore[arg-type]


async def test_no_reply_before_the_write(autojump_clock: Clock) -> None:
    store = GatedStore()
    async with registry_on(store) as registry:
        answered = trio.Event()

        async def join() -> None:
            await Member(registry, "orders", "billing", "a").heartbeat()
            answered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(join)
            await trio.sleep(5)
            assert not answered.is_set()
            assert store.appends == 0
            store.gate.set()
        assert answered.is_set()


class HeldTokens(MemoryEffects):
    """`set_owners` waits while `gate` is set and not yet opened."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: trio.Event | None = None

    async def set_owners(self, group: str, tokens: Any) -> None:
        if self.gate is not None:
            await self.gate.wait()
        await super().set_owners(group, tokens)


class HeldCheckpoints(MemoryStore):
    """An append carrying a checkpoint waits while `gate` is set and not yet opened; records
    how many events each checkpoint came with."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: trio.Event | None = None
        self.checkpoints_with: list[int] = []

    async def append(
        self, aggregate: Any, expected_revision: int, events: Any, checkpoint: Any = None
    ) -> Any:
        if checkpoint is not None:
            self.checkpoints_with.append(len(events))
            if self.gate is not None:
                await self.gate.wait()
        return await super().append(aggregate, expected_revision, events, checkpoint)


async def settled(members: list[Member]) -> None:
    """Heartbeat every member until none has anything left to do."""
    for _ in range(20):
        for member in members:
            await member.heartbeat()
        machines = [m.machine for m in members]
        if all(not m.pending and not m.revoking and not m.to_ack for m in machines):
            return
    raise AssertionError("the group did not settle")


async def test_an_epoch_only_token_rewrite_waits_for_no_answer(autojump_clock: Clock) -> None:
    """A member that only advances its epoch (its shards stay) is answered before the owner
    tokens of what it holds are rewritten with the new epoch (the data plane compares the member
    id and incarnation only); they are, before the next batch. Installs are not deferred.
    (Below feature level 8: from it, such a member moves with the target and no token changes.)"""
    effects = HeldTokens()
    async with registry_on(MemoryStore(level=GROUP_OPS_LEVEL), effects) as registry:
        members = [Member(registry, "orders", "billing", f"m{i}") for i in range(7)]  # 6 shards
        await settled(members)
        idle = next(m for m in members if not m.owned)
        await idle.leave()  # the group epoch moves; every other member keeps its shard
        holder = members[0] if members[0] is not idle else members[1]
        (shard,) = holder.owned
        key = next(k for k, g in effects.tokens if effects.tokens[k, g].member_id == holder.member_id)
        before = effects.tokens[key, "billing"].member_epoch
        effects.gate = trio.Event()
        with trio.fail_after(1):  # answered although the token write waits
            answer = await holder.heartbeat()
        assert answer.member_epoch > before
        assert answer.assignment.assigned == {shard}
        assert effects.tokens[key, "billing"].member_epoch == before
        effects.gate.set()
        await trio.sleep(0.1)
        assert effects.tokens[key, "billing"].member_epoch == answer.member_epoch


async def test_members_that_keep_their_shards_move_with_the_target_and_no_token_changes(
    autojump_clock: Clock,
) -> None:
    """From feature level 8 a target moves the members whose shards it keeps to its epoch: their
    next heartbeats journal nothing and write no owner token (a token names the epoch of its
    install or of its holder's last advance of its own)."""
    log: list[str] = []
    effects = RecordedTokens(log)
    store = MemoryStore()
    async with registry_on(store, effects) as registry:
        members = [Member(registry, "orders", "billing", f"m{i}") for i in range(7)]  # 6 shards
        await settled(members)
        idle = next(m for m in members if not m.owned)
        appends = store.appends
        await idle.leave()  # the group epoch moves; every other member keeps its shard
        await trio.testing.wait_all_tasks_blocked()
        assert store.appends == appends + 1  # the leave and the target, in one write
        state = (await registry.group("orders", "billing")).state
        assert state is not None
        log.clear()
        for member in members:
            if member is not idle:
                answer = await member.heartbeat()
                assert answer.member_epoch == state.assignment_epoch
        await trio.testing.wait_all_tasks_blocked()
        assert log == []
        assert store.appends == appends + 1
        assert max(t.member_epoch for t in effects.tokens.values()) < state.assignment_epoch


class RecordedTokens(MemoryEffects):
    """Records each `set_owners` call, in `log` (shared with the test's answers)."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def set_owners(self, group: str, tokens: Any) -> None:
        self.log.append(f"tokens {len(tokens)}")
        await super().set_owners(group, tokens)


async def test_commands_that_wait_are_answered_before_the_bookkeeping(autojump_clock: Clock) -> None:
    """Batches that arrive together (a fleet in step) are answered one after another before the
    epoch-only token rewrites of any of them, which then come in one pass, from the state then
    (below feature level 8, where members that keep their shards advance one by one)."""
    log: list[str] = []
    effects = RecordedTokens(log)
    settings = attrs.evolve(SETTINGS, actor=attrs.evolve(SETTINGS.actor, max_batch=4))
    async with registry_on(MemoryStore(level=GROUP_OPS_LEVEL), effects, settings) as registry:
        members = [Member(registry, "orders", "billing", f"m{i}") for i in range(7)]  # 6 shards
        await settled(members)
        idle = next(m for m in members if not m.owned)
        await idle.leave()  # the group epoch moves; every other member keeps its shard
        await trio.testing.wait_all_tasks_blocked()
        log.clear()

        async def beat(member: Member) -> None:
            await member.heartbeat()
            log.append("answer")

        async with trio.open_nursery() as nursery:  # six commands, batches of at most four
            for member in members:
                if member is not idle:
                    nursery.start_soon(beat, member)
        await trio.testing.wait_all_tasks_blocked()
        assert log == ["answer"] * 6 + ["tokens 6"]
        state = (await registry.group("orders", "billing")).state
        assert state is not None
        assert {t.member_epoch for t in effects.tokens.values()} == {state.assignment_epoch}


async def test_a_checkpoint_is_written_once_its_batch_is_answered(autojump_clock: Clock) -> None:
    """The checkpoint a batch makes due is written after that batch's askers have their answers,
    as an append of its own (no events) at the batch's revision; a reload folds the same state."""
    store = HeldCheckpoints()
    async with registry_on(store) as registry:
        members = [Member(registry, "orders", "billing", f"m{i:03}") for i in range(30)]
        store.gate = trio.Event()
        with trio.fail_after(60):  # every heartbeat is answered, the one that made it due too
            while not store.checkpoints_with:
                for member in members:
                    await member.heartbeat()
                    await trio.testing.wait_all_tasks_blocked()  # (the actor's bookkeeping)
                    if store.checkpoints_with:
                        break
        actor = await registry.group("orders", "billing")
        revision = actor.revision
        store.gate.set()
        await settled(members)
        assert set(store.checkpoints_with) == {0}
        entries = store.aggregates[AggregateId("orders", "billing")].entries
        first = next(e for e in entries if e.is_checkpoint)
        assert first.revision == revision
        assert await journal_state(store, "orders", "billing") == actor.state


class FailingCheckpoints(MemoryStore):
    """An append carrying a checkpoint fails (Redis away) while `failing`; counts the tries."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True
        self.tries = 0

    async def append(
        self, aggregate: Any, expected_revision: int, events: Any, checkpoint: Any = None
    ) -> Any:
        if checkpoint is not None:
            self.tries += 1
            if self.failing:
                raise StoreUnavailable("redis is away")
        return await super().append(aggregate, expected_revision, events, checkpoint)


async def test_a_checkpoint_that_failed_is_due_again_at_the_next_write_not_every_batch(
    autojump_clock: Clock,
) -> None:
    """A failed checkpoint fails nobody's answer and is tried again with the next durable write;
    batches that write nothing (steady heartbeats) do not try it again each."""
    store = FailingCheckpoints()
    async with registry_on(store) as registry:
        members = [Member(registry, "orders", "billing", f"m{i:03}") for i in range(30)]
        while not store.tries:
            for member in members:
                await member.heartbeat()
        await settled(members)
        await trio.testing.wait_all_tasks_blocked()
        tries = store.tries
        for _ in range(5):  # steady: nothing durable to write
            for member in members:
                await member.heartbeat()
        await trio.testing.wait_all_tasks_blocked()
        assert store.tries == tries
        store.failing = False
        await members[0].leave()  # durable events: the checkpoint is due again
        await trio.testing.wait_all_tasks_blocked()
        assert store.tries > tries
        actor = await registry.group("orders", "billing")
        assert any(e.is_checkpoint for e in store.aggregates[AggregateId("orders", "billing")].entries)
        assert await journal_state(store, "orders", "billing") == actor.state


async def test_refused_command_does_not_spoil_its_batch(autojump_clock: Clock) -> None:
    async with registry_on() as registry:
        a = Member(registry, "orders", "billing", "a")
        await a.heartbeat()
        outcomes: list[str] = []

        async def imposter() -> None:
            try:
                await Member(registry, "orders", "billing", "a", incarnation="other").heartbeat()
            except IncarnationMismatch:
                outcomes.append("refused")

        async def joiner() -> None:
            await Member(registry, "orders", "billing", "b").heartbeat()
            outcomes.append("joined")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(imposter)
            nursery.start_soon(joiner)
        assert sorted(outcomes) == ["joined", "refused"]


async def test_conflict_reloads_and_retries(autojump_clock: Clock) -> None:
    """Two coordinators on one store: each write of one makes the other's next write conflict."""
    store = MemoryStore()
    async with registry_on(store) as first, registry_on(store) as second:
        a = Member(first, "orders", "billing", "a")
        await a.heartbeat()
        b = Member(second, "orders", "billing", "b")
        await b.heartbeat()  # second's actor loaded after a joined
        c = Member(first, "orders", "billing", "c")
        await c.heartbeat()  # first's actor is stale: conflict, reload, retry
        actor = await first.group("orders", "billing")
        assert set(actor.leases) == {"a", "b", "c"}  # b joined elsewhere: its lease starts on reload
        await trio.sleep(1)  # ticks on first's actor
        state = actor.state
        assert state is not None
        assert set(state.members) == {"a", "b", "c"}
        replayed = await journal_state(store, "orders", "billing")
        assert replayed is not None
        assert replayed == state


async def test_a_conflict_reload_keeps_live_members_alive(autojump_clock: Clock) -> None:
    """Leases are never journaled: after reloading on a conflict, they start over in full."""
    store = MemoryStore()
    async with registry_on(store) as registry:
        a = Member(registry, "orders", "billing", "a")
        x = Member(registry, "orders", "billing", "x")
        for _ in range(3 * TIMING.lease_ttl_ms // 1000):  # well past the leases the joins gave
            await a.heartbeat()
            await x.heartbeat()
            await trio.sleep(1)
        actor = await registry.group("orders", "billing")
        # Another writer moves the journal on (a config change), as a second coordinator would.
        aggregate = actor.aggregate
        foreign = aggregate.event_to_json(GroupConfigured(GroupConfig(max_concurrency=2)))
        await store.append(aggregate.aggregate_id, actor.revision, [foreign], None)
        await Member(registry, "orders", "billing", "c").heartbeat()  # a write: conflict, reload, again
        assert actor.conflicts == 1
        assert actor.state is not None
        assert actor.state.config.max_concurrency == 2
        assert actor.leases["x"] > TrioClock().now_ms()  # x is not fenced by the next tick
        await trio.sleep(1.5)
        assert "x" in actor.state.members


async def test_recovery_restarts_timers_in_full(autojump_clock: Clock) -> None:
    store = MemoryStore()
    async with registry_on(store) as registry:
        a = Member(registry, "orders", "billing", "a")
        await a.heartbeat()
        await trio.sleep(4)  # 1 s of a's lease left
        registry.stop(AggregateId("orders", "billing"))
        await trio.sleep(0.1)
        actor = await registry.group("orders", "billing")
        assert actor.state is not None
        assert actor.leases["a"] >= TrioClock().now_ms() + TIMING.lease_ttl_ms - 100
        await trio.sleep(3)
        assert "a" in actor.state.members  # would have expired without the restart
        await trio.sleep(3)
        assert "a" not in actor.state.members
    kinds = [e.kind for e in await store.read(AggregateId("orders", "billing"))]
    assert "TimersRestarted" in kinds


async def test_idle_actors_stop_and_come_back(autojump_clock: Clock) -> None:
    settings = attrs.evolve(SETTINGS, idle_after_s=60.0)
    async with registry_on(settings=settings) as registry:
        a = Member(registry, "orders", "billing", "a")
        await a.heartbeat()
        await a.leave()
        assert AggregateId("orders", "billing") in registry.actors
        await trio.sleep(120)
        assert registry.actors == {}
        r = await Member(registry, "orders", "billing", "b").heartbeat()
        assert r.assignment.assigned == frozenset(range(6))


async def test_an_actor_ticks_at_its_aggregates_deadlines_only(
    autojump_clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tick while every member heartbeats in time (nothing is due); one at a silent
    member's lease end, which fences it then, not a tick interval later; none at all once the
    group is empty (its actor still running): idle and quiet groups cost no CPU."""
    ticks: list[float] = []  # when the actor woke without a command to inject a tick
    original = GroupAggregate.tick

    def counting(self: GroupAggregate, *args: Any) -> Any:
        ticks.append(trio.current_time())
        return original(self, *args)

    monkeypatch.setattr(GroupAggregate, "tick", counting)
    async with registry_on() as registry:
        a = Member(registry, "orders", "billing", "a")
        b = Member(registry, "orders", "billing", "b")
        await a.heartbeat()
        await b.heartbeat()
        for _ in range(20):
            await trio.sleep(1)
            await a.heartbeat()
            await b.heartbeat()
        assert ticks == []  # leases renewed all along: nothing was due
        silent_from = trio.current_time()  # b's last heartbeat: its lease ends 5 s later
        for _ in range(8):
            await trio.sleep(1)
            await a.heartbeat()
        state = (await registry.group("orders", "billing")).state
        assert state is not None
        assert state.fenced["b"].reason is FenceReason.LEASE_EXPIRED
        assert ticks
        assert ticks[0] - silent_from == pytest.approx(TIMING.lease_ttl_ms / 1000, abs=0.01)
        await a.leave()
        await trio.sleep(60)  # what the leave left to time out (holds, quarantine) has by now
        before = len(ticks)
        await trio.sleep(600)
        assert len(ticks) == before
        assert registry.running_actor(AggregateId("orders", "billing")) is not None


async def test_stopped_actor_fails_waiters_instead_of_hanging(autojump_clock: Clock) -> None:
    store = GatedStore()
    actor = Actor(GroupAggregate(AggregateId("s", "g"), MemoryEffects()), store, TrioClock(), ActorSettings())
    errors: list[BaseException] = []

    async def ask() -> None:
        try:
            await actor.ask(CreateGroup("s", "g", layout(3)))
        except ActorStopped as exc:
            errors.append(exc)

    async with trio.open_nursery() as outer, trio.open_nursery() as actor_nursery:
        await actor_nursery.start(actor.run)
        outer.start_soon(ask)
        await trio.sleep(1)  # the ask waits on the gated write
        actor_nursery.cancel_scope.cancel()
    assert len(errors) == 1
    with pytest.raises(ActorStopped):
        await actor.ask(ConfigureGroup(GroupConfig()))


async def test_scale_out_reaches_the_group(autojump_clock: Clock) -> None:
    effects = MemoryEffects()
    async with registry_on(effects=effects) as registry:
        a = Member(registry, "orders", "billing", "a")
        await a.heartbeat()
        await registry.ask_stream("orders", ChangeShardCount(9))
        await trio.sleep(0.1)  # the push to the group runs in the background
        r = await a.heartbeat()
        assert r.assignment.assigned == frozenset(range(9))
        assert r.metadata_version == 2
    new_keys = {key for key, g in effects.consumer_groups if g == "billing"}
    assert len(new_keys) == 9


class GatedEffects(MemoryEffects):
    """Consumer-group creation waits for `gate`: the window in which a layout could leak early."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.waiting = trio.Event()

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None:
        keys = list(shard_keys)
        if len(keys) == 4 and not self.gate.is_set():  # the scale-out's new shards
            self.waiting.set()
            await self.gate.wait()
        await super().ensure_consumer_groups(keys, group, start_id)


async def test_a_new_layout_is_visible_only_once_its_keys_and_groups_exist(autojump_clock: Clock) -> None:
    effects = GatedEffects()
    async with registry_on(effects=effects) as registry, trio.open_nursery() as nursery:
        await Member(registry, "orders", "billing", "a").heartbeat()
        await admin_changes.change_shard_count(registry, "orders", 11)  # 6 -> 11: five new shards, not gated
        stream = await registry.stream("orders")
        nursery.start_soon(admin_changes.change_shard_count, registry, "orders", 15)
        await effects.waiting.wait()
        await trio.sleep(1)
        assert stream.state is not None
        assert stream.state.layout.metadata_version == 2  # v3 is journaled, its groups not yet made
        effects.gate.set()
        await trio.sleep(0.1)
        assert stream.state.layout.metadata_version == 3
        assert {k for k, g in effects.consumer_groups if g == "billing"} >= {
            s.key for s in stream.state.layout.shards
        }


async def test_unknown_stream_without_auto_create(autojump_clock: Clock) -> None:
    settings = attrs.evolve(SETTINGS, auto_create_streams=False)
    async with registry_on(settings=settings) as registry:
        with pytest.raises(UnknownStream):
            await Member(registry, "nowhere", "billing", "a").heartbeat()
        await registry.stream("nowhere", create=True)
        assert (await Member(registry, "nowhere", "billing", "a").heartbeat()).status is HeartbeatStatus.OK


class _SlowTopology(MemoryEffects):
    """Creation takes a while (as reading a cluster's slots does), so others look meanwhile."""

    async def topology(self) -> None:
        await trio.sleep(1)

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None:
        await trio.sleep(1)
        await super().ensure_consumer_groups(shard_keys, group, start_id)


@pytest.mark.parametrize("kind", ["stream", "group"])
async def test_a_lookup_that_finds_nothing_does_not_stop_a_creation_in_flight(
    autojump_clock: Clock, kind: str
) -> None:
    """Reads of a resource being created (a view, an admin GET, an `If-Match` check) find it
    missing; stopping its actor for that failed the creation half-way (503 "restarting")."""
    async with registry_on(effects=_SlowTopology()) as registry:
        if kind == "group":
            await registry.stream("orders", create=True, shard_count=2)

        async def create() -> None:
            if kind == "stream":
                await registry.stream("orders", create=True, shard_count=2)
            else:
                await registry.group("orders", "billing", GroupConfig(max_concurrency=3))

        async def look() -> None:
            for _ in range(10):
                with contextlib.suppress(UnknownStream, UnknownGroup):
                    if kind == "stream":
                        await registry.stream("orders", create=False)
                    else:
                        await registry.group("orders", "billing", create=False)
                await trio.sleep(0.2)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(look)
            await trio.sleep(0)
            nursery.start_soon(create)
            nursery.start_soon(look)
        if kind == "stream":
            assert (await registry.stream("orders", create=False)).state.layout.metadata_version == 1
        else:
            group_actor = await registry.group("orders", "billing", create=False)
            assert group_actor.state.config.max_concurrency == 3


class _SlowShardKeys(MemoryEffects):
    """The side effects of a creation (shard keys) take a while."""

    async def ensure_streams(self, shard_keys: Iterable[str]) -> None:
        await trio.sleep(1)
        await super().ensure_streams(shard_keys)


async def test_a_create_only_arriving_while_the_creation_s_side_effects_run_is_refused(
    autojump_clock: Clock,
) -> None:
    """The journal's revision moves at the write, the state readers see only after the side
    effects: a create-only (`If-None-Match: *`) in between saw no state but the new revision,
    passed its check and went on to reshard what the first one made."""
    async with registry_on(effects=_SlowShardKeys()) as registry:
        outcomes: dict[str, object] = {}

        async def create(name: str, count: int, after: float) -> None:
            await trio.sleep(after)
            try:
                await registry.stream("orders", create=True, shard_count=count, only_new=True)
                outcomes[name] = "created"
            except PreconditionFailed as exc:
                outcomes[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "first", 2, 0)
            nursery.start_soon(create, "second", 3, 0.5)  # during the first one's side effects
        assert outcomes["first"] == "created"
        assert isinstance(outcomes["second"], PreconditionFailed), outcomes
        actor = await registry.stream("orders", create=False)
        assert len(actor.state.layout.shards) == 2
        assert actor.revision == 2  # one creation: StreamCreated and its retention (feature level 5)


async def test_a_stream_made_by_a_first_heartbeat_is_one_info_line(
    autojump_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A misspelt stream name in a producer or member creates a stream (auto_create_streams):
    the coordinator says so, once, naming it; an operator's create is not logged here."""
    caplog.set_level("INFO", logger="rsc.registry")
    async with registry_on() as registry:
        await registry.stream("ordrs")  # as a heartbeat asks
        await registry.stream("ordrs")
        await registry.stream("orders", create=True, shard_count=2)  # as the Admin API asks
    lines = [r.getMessage() for r in caplog.records if "for the first heartbeat" in r.getMessage()]
    count = SETTINGS.default_shard_count
    assert lines == [
        f"created stream 'ordrs' with {count} shard(s) for the first heartbeat naming it "
        "(auto_create_streams; false refuses unknown streams)"
    ]


class _SlowConsumerGroups(MemoryEffects):
    """A group's creation (its Redis consumer groups) takes a while."""

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None:
        await trio.sleep(1)
        await super().ensure_consumer_groups(shard_keys, group, start_id)


async def test_a_layout_change_during_a_group_s_creation_reaches_the_group(autojump_clock: Clock) -> None:
    """The creation carries the layout read before the change; the change's push found the group
    not there yet (pushes never create) and was dropped: the group read the old shards for good."""
    async with registry_on(effects=_SlowConsumerGroups()) as registry:
        await registry.stream("orders", create=True, shard_count=6)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(registry.group, "orders", "billing")
            await trio.sleep(0.5)  # the group's creation is under way
            nursery.start_soon(admin_changes.change_shard_count, registry, "orders", 8)
        await trio.sleep(5)  # the pushes run
        stream = await registry.stream("orders", create=False)
        group_actor = await registry.group("orders", "billing", create=False)
        assert stream.state.layout.metadata_version == 2
        assert group_actor.state.layout == stream.state.layout


async def test_a_group_delete_that_stopped_half_way_is_finished_by_the_next(autojump_clock: Clock) -> None:
    """The group recorded its deletion, the stream's write did not happen (a failure, a term
    that ended): a DELETE again finishes it, and the stream can then be deleted."""
    async with registry_on() as registry:
        await registry.stream("orders", create=True, shard_count=1)
        await registry.group("orders", "billing")
        await registry.ask_group("orders", "billing", DeleteGroup(0), create=False)  # the first write only
        assert "billing" in (await registry.stream("orders", create=False)).state.groups
        await admin_changes.delete_group(registry, "orders", "billing")
        assert "billing" not in (await registry.stream("orders", create=False)).state.groups
        await admin_changes.delete_stream(registry, "orders")
        await registry.stream("other", create=True, shard_count=1)
        with pytest.raises(UnknownGroup):
            await admin_changes.delete_group(registry, "other", "billing")  # nothing there: still refused


class _CountingStore(MemoryStore):
    """A memory store that counts the loads of each aggregate."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: dict[AggregateId, int] = {}

    async def load(self, aggregate: AggregateId) -> Any:
        self.loads[aggregate] = self.loads.get(aggregate, 0) + 1
        return await super().load(aggregate)


async def test_a_look_then_a_creation_loads_once_and_a_refusal_keeps_nothing(autojump_clock: Clock) -> None:
    store = _CountingStore()
    async with registry_on(store) as registry:
        with registry.creating("made"):  # as an admin PUT: is it there? no: create it
            with pytest.raises(UnknownStream):
                await registry.stream("made", create=False)
            assert registry.running_actor(AggregateId("made")) is not None  # kept in between
            await registry.stream("made", create=True, shard_count=2)
        assert store.loads[AggregateId("made")] == 1
        assert registry.running_actor(AggregateId("made")) is not None
        # looked at, then not created (a 412, a quota)
        with registry.creating("refused"), pytest.raises(UnknownStream):
            await registry.stream("refused", create=False)
        assert registry.running_actor(AggregateId("refused")) is None  # nothing kept for a missing name
        with pytest.raises(UnknownStream):  # and outside such a block, a look keeps nothing either
            await registry.stream("looked", create=False)
        assert registry.running_actor(AggregateId("looked")) is None

"""A hypothesis state machine over the group aggregate.

Random joins, leaves, crashes, restarts, heartbeats with any epoch (stale,
future, wrong incarnation), acks, ticks, shard-count changes and removals;
static members that leave and return, crash, are taken over by a new process
while the old one still runs (a zombie), and whose holds end.
After every step the invariants of PROTOCOL section 4 are checked; the
`settle` rule lets every live client heartbeat honestly and then checks
convergence: every readable shard installed, balance, stable members.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rsc.events import group
from rsc.events.commands import (
    ApplyLayout,
    ChangeShardCount,
    CreateGroup,
    CreateStream,
    DeleteGroup,
    PauseGroup,
    RemoveMember,
    ResumeGroup,
    RetireShards,
    Tick,
)
from rsc.events.errors import IncarnationMismatch, NotEmpty
from rsc.events.events import (
    GroupDeleted,
    MemberFenced,
    MemberJoined,
    MemberLeft,
    QuarantineEnded,
    ShardsInstalled,
    ShardsQuarantined,
    ShardsReleased,
    ShardsRevokeAcked,
)
from rsc.events.liveness import Leases
from rsc.events.member_machine import MemberMachine, MemberSettings
from rsc.events.model import (
    ClientInfo,
    DrainCheck,
    DrainProgress,
    FenceReason,
    HeartbeatStatus,
    Hold,
    MemberState,
    ReleaseReason,
)
from rsc.events.respond import respond
from rsc.events.stream import MAX_SHARDS, StreamState
from rsc.events.stream import decide as stream_decide
from rsc.events.stream import fold as stream_fold
from tests.groupkit import TIMING, Group

CLIENT = ClientInfo("hypothesis", "1")
MEMBER_IDS = [f"10.0.0.{i}/worker/0" for i in range(6)]
REJECTED = (HeartbeatStatus.FENCED, HeartbeatStatus.UNKNOWN_MEMBER)


class _MemberByMember(Mapping[str, int]):
    """The lease table read through `Mapping`'s own methods, with one extra entry nobody holds:
    `due_ms` cannot take its one pass over the table."""

    def __init__(self, leases: Mapping[str, int]) -> None:
        self.leases = {**leases, "nobody": 0}

    def __getitem__(self, key: str) -> int:
        if key == "nobody":
            raise KeyError(key)
        return self.leases[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.leases)

    def __len__(self) -> int:
        return len(self.leases)


@attrs.define
class Client:
    """An honest member process: the shipped member machine, and whether the process runs."""

    machine: MemberMachine
    crashed: bool = False

    @property
    def incarnation(self) -> str:
        return self.machine.incarnation


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        stream = stream_fold(stream_decide(None, CreateStream("orders", 4)))
        assert stream is not None
        self.stream: StreamState = stream
        self.g = Group.create(shards=4)
        self.clients: dict[str, Client] = {}
        self.incarnations = 0
        self.checked = 0  # events already checked for order
        self.holder: dict[int, str] = {}
        self.acked: dict[str, frozenset[int]] = {}
        self.epochs = (0, 0)
        self.member_epochs: dict[str, int] = {}
        #: Old processes of static ids that a new one took over while they still ran.
        self.zombies: dict[str, list[Client]] = {}
        self.timed_checked = 0
        self.quarantined: dict[int, int] = {}

    # --- helpers ---------------------------------------------------------

    def new_client(self, member_id: str, static: bool = False) -> Client:
        self.incarnations += 1
        settings = MemberSettings(
            heartbeat_interval_ms=TIMING.heartbeat_interval_ms,
            lease_ttl_ms=TIMING.lease_ttl_ms,
            static=static,
        )
        return Client(
            MemberMachine("orders", "billing", member_id, f"inc-{self.incarnations}", CLIENT, settings)
        )

    def honest(self, member_id: str, ack: bool, pending: int = 0) -> None:
        """The member's shell: the lease rule, revokes finished (`ack`) or not, one heartbeat
        reporting `pending` entries on each DRAINING shard it reads (and on one it does not)."""
        machine = self.clients[member_id].machine
        now = self.g.now / 1000
        machine.silent(now)
        if ack:
            machine.revoked(machine.revoking)  # in-flight work finished
        draining = {s.index for s in self.g.state.layout.draining}
        reports = [DrainProgress(s, pending, None) for s in sorted(machine.owned & draining)]
        reports.append(DrainProgress(MAX_SHARDS - 1, pending, 0))  # not its shard: ignored
        request = machine.request(now, tuple(reports))
        command = request.to_command(self.g.now)
        try:
            events = self.g.run(command)
        except IncarnationMismatch:
            assert self.g.state.members[member_id].incarnation != machine.incarnation
            machine.failed(request, now, "another incarnation is live")
            if machine.left:  # its leave was refused: the old incarnation's lease ends it
                del self.clients[member_id]
            return
        r = respond(self.g.state, command, events)
        if r.status is HeartbeatStatus.OK:
            assert not r.assignment.pending
            assert not r.assignment.revoke
        machine.receive(request, r, now)
        if machine.replaced is not None:  # a newer process has its id: this one stops
            assert self.g.state.members[member_id].incarnation != machine.incarnation
            del self.clients[member_id]
        elif machine.left:  # the process exits
            assert member_id not in self.g.state.members
            del self.clients[member_id]

    # --- rules -------------------------------------------------------------

    @rule(member_id=st.sampled_from(MEMBER_IDS), static=st.booleans())
    def join(self, member_id: str, static: bool) -> None:
        """A new process joins, or a paused one resumes (the lease rule applies first)."""
        client = self.clients.setdefault(member_id, self.new_client(member_id, static))
        client.crashed = False
        self.honest(member_id, ack=False)
        self.check_returned(member_id)

    @rule(member_id=st.sampled_from(MEMBER_IDS), ack=st.booleans(), pending=st.integers(0, 3))
    def heartbeat(self, member_id: str, ack: bool, pending: int) -> None:
        client = self.clients.get(member_id)
        if client is not None and not client.crashed:
            self.honest(member_id, ack, pending)

    @rule(
        member_id=st.sampled_from(MEMBER_IDS),
        epoch=st.integers(min_value=-1, max_value=30),
        owned=st.frozensets(st.integers(0, 20), max_size=6),
        data=st.data(),
    )
    def rogue_heartbeat(self, member_id: str, epoch: int, owned: frozenset[int], data: st.DataObject) -> None:
        """A delayed, duplicated or foreign request: whatever it is, invariants hold.

        Its incarnation is one a process was given already (a delayed or duplicated request of
        a real process) or one no process ever gets (a foreign caller): never the incarnation
        a process starting later will be given. (Incarnations are random: a request naming a
        future process's is that process as far as any coordinator can tell. With the
        model's counter, `inc-2` sent before the second process started made the rebuilt
        group take in "its" shard 0, then gave it to the real inc-2 when it joined, while the
        shard's real holder still handled it: seed 965387527.)"""
        issued = [f"inc-{n}" for n in range(1, self.incarnations + 1)]
        incarnation = data.draw(st.sampled_from([*issued, "zombie"]), label="incarnation")
        live = self.g.state.members.get(member_id)
        superseded = incarnation in self.g.state.superseded.get(member_id, ())
        try:
            r = self.g.hb(member_id, epoch, owned, frozenset(), incarnation)
        except IncarnationMismatch:
            assert live is not None
            assert live.incarnation != incarnation
            return
        if superseded:
            assert (r.status, r.fence_reason) == (HeartbeatStatus.FENCED, FenceReason.REPLACED)
            return
        assert live is None or live.incarnation == incarnation
        if r.status not in REJECTED and epoch > 0 and live is None:
            # taken in as a holder of a group Redis lost: what it reported was quarantined
            adopted = self.g.state.members[member_id]
            assert adopted.incarnation == incarnation
            assert owned & self.g.state.layout.readable_indexes <= adopted.installed
        elif r.status not in REJECTED and epoch > 0:
            assert live is not None
            if live.quiet:  # moved by targets that kept its shards: any epoch since it was told
                assert live.previous_epoch <= epoch <= live.member_epoch
            else:
                assert epoch in (live.member_epoch, live.previous_epoch)

    @rule(member_id=st.sampled_from(MEMBER_IDS))
    def leave(self, member_id: str) -> None:
        """A graceful leave begins: the next heartbeats say `leaving`, the coordinator hands
        its shards over as their next owners become ready, then it sends epoch -1."""
        client = self.clients.get(member_id)
        if client is None or client.crashed:
            return
        client.machine.stop()
        self.honest(member_id, ack=True)

    @rule(member_id=st.sampled_from(MEMBER_IDS))
    def crash(self, member_id: str) -> None:
        if member_id in self.clients:
            self.clients[member_id].crashed = True

    @rule(member_id=st.sampled_from(MEMBER_IDS), static=st.booleans(), old_runs=st.booleans())
    def restart(self, member_id: str, static: bool, old_runs: bool) -> None:
        """The process comes back with a new incarnation and joins; the old one may still run
        (a duplicate deployment, a pause): it goes on as a zombie."""
        old = self.clients.get(member_id)
        if old is not None and old_runs and not old.crashed:
            self.zombies.setdefault(member_id, []).append(old)
        state = self.g.state
        hold = state.holds.get(member_id)
        known = state.members.get(member_id) or hold or state.fenced.get(member_id)
        self.clients[member_id] = self.new_client(member_id, static)
        self.honest(member_id, ack=False)
        live = self.g.state.members.get(member_id)
        if live is not None and live.incarnation == self.clients[member_id].incarnation and live.static:
            # a static takeover or return: the old incarnation is superseded for good
            before = known.incarnation if known is not None else None
            if before is not None and before != live.incarnation:
                assert before in self.g.state.superseded.get(member_id, ())
        self.check_returned(member_id, hold)

    def check_returned(self, member_id: str, hold: Hold | None = None) -> None:
        """A static member back within its hold is targeted what was held for it, as far as its
        quota goes (all of it unless the group changed meanwhile: a member joined, say)."""
        state = self.g.state
        member = state.members.get(member_id)
        if hold is None or not hold.static or member is None or self.g.now >= hold.until_ms:
            return
        if state.assignment_epoch == state.group_epoch:
            # A DRAINING shard is never held (GroupState.held): it went to another member to be
            # read to its end; only the ACTIVE shards of the hold come back.
            held, target = hold.shards & state.layout.active_indexes, state.target_of(member_id)
            assert len(held & target) == min(len(held), len(target)), (held, target)

    @rule(member_id=st.sampled_from(MEMBER_IDS), ack=st.booleans())
    def zombie_heartbeat(self, member_id: str, ack: bool) -> None:
        """An old process of a static id heartbeats: once superseded it is told REPLACED, and
        it never gets a shard again."""
        zombies = self.zombies.get(member_id)
        if not zombies:
            return
        zombie = zombies[0]
        machine = zombie.machine
        now = self.g.now / 1000
        machine.silent(now)
        if ack:
            machine.revoked(machine.revoking)
        request = machine.request(now)
        command = request.to_command(self.g.now)
        superseded = machine.incarnation in self.g.state.superseded.get(member_id, ())
        try:
            events = self.g.run(command)
        except IncarnationMismatch:
            assert not superseded
            machine.failed(request, now, "another incarnation is live")
            if machine.left:
                zombies.pop(0)
            return
        r = respond(self.g.state, command, events)
        if superseded:
            assert (r.status, r.fence_reason) == (HeartbeatStatus.FENCED, FenceReason.REPLACED)
            assert not r.assignment.assigned
        machine.receive(request, r, now)
        if machine.left or machine.replaced is not None:
            zombies.pop(0)

    @rule(advance=st.integers(min_value=0, max_value=6_000))
    def tick(self, advance: int) -> None:
        self.g.tick(advance)

    @rule(shards=st.integers(min_value=0, max_value=12))
    def reshard(self, shards: int) -> None:
        events = stream_decide(self.stream, ChangeShardCount(shards))
        stream = stream_fold(events, self.stream)
        assert stream is not None
        self.stream = stream
        self.g.run(ApplyLayout(stream.layout, self.g.now))

    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        """Some DRAINING shards retire (their evidence held): the group stops reading them."""
        draining = sorted(s.index for s in self.stream.layout.draining)
        if not draining:
            return
        chosen = frozenset(data.draw(st.lists(st.sampled_from(draining), min_size=1, unique=True)))
        evidence = {i: DrainCheck(sealed=True, drained=True) for i in chosen}
        stream = stream_fold(stream_decide(self.stream, RetireShards(chosen, 0, evidence)), self.stream)
        assert stream is not None
        self.stream = stream
        self.g.run(ApplyLayout(stream.layout, self.g.now))
        assert not chosen & self.g.state.layout.readable_indexes

    @precondition(lambda self: bool(self.g.state.members))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        member_id = data.draw(st.sampled_from(sorted(self.g.state.members)))
        self.g.run(RemoveMember(member_id, self.g.now))

    @rule(reason=st.sampled_from(["maintenance", "downstream down"]))
    def pause(self, reason: str) -> None:
        """An operator pauses the group (feature level 7): its target empties at once."""
        self.g.run(PauseGroup(reason, self.g.now))
        assert self.g.state.paused is not None
        assert not any(self.g.state.target.values())

    @rule()
    def resume(self) -> None:
        self.g.run(ResumeGroup(self.g.now))
        assert self.g.state.paused is None

    @precondition(lambda self: not self.g.state.members)
    @rule()
    def delete_and_recreate(self) -> None:
        """The Admin API deletes the empty group; a later join creates it afresh (epochs restart).
        Refused while a shard is quarantined (a process may still be handling it)."""
        if self.g.state.quarantined(self.g.now):
            with pytest.raises(NotEmpty):
                self.g.run(DeleteGroup(self.g.now))
            return
        self.g.run(DeleteGroup(self.g.now))
        assert self.g.state.deleted
        self.g.run(
            CreateGroup("orders", "billing", self.stream.layout, self.g.state.timing, now_ms=self.g.now)
        )
        assert not self.g.state.deleted
        self.epochs = (0, 0)
        self.member_epochs = {}

    @rule()
    def redis_loses_the_group(self) -> None:
        """Redis loses the group and no coordinator remembers it: it is recreated (rebuilt) on
        the stream's layout while every member process runs on, holding what it held. The
        journal, the lease table and every epoch start again."""
        command = CreateGroup(
            "orders", "billing", self.stream.layout, self.g.state.timing, now_ms=self.g.now, rebuilt=True
        )
        self.g.state, events = group.execute(None, command, self.g.level)
        self.g.events = list(events)
        self.g.timed = [(self.g.now, e) for e in events]
        self.g.leases = Leases()
        self.checked = self.timed_checked = 0
        self.holder, self.acked, self.quarantined = {}, {}, {}
        self.epochs, self.member_epochs = (0, 0), {}
        self._draining_owners = {}

    @rule()
    def settle(self) -> None:
        """Every live client heartbeats honestly for a while: the group converges.

        Enough rounds for a crashed member's (or a zombie's) lease to end and
        for the handoffs that follow; the loop stops early once all is stable.
        """
        rounds = 3 * TIMING.lease_ttl_ms // TIMING.heartbeat_interval_ms + 6
        for _ in range(rounds):
            for member_id, client in sorted(self.clients.items()):
                if not client.crashed:
                    self.honest(member_id, ack=True)
            self.g.tick(TIMING.heartbeat_interval_ms)
            if self.stable():
                break
        state = self.g.state
        live = {m for m, c in self.clients.items() if not c.crashed and m in state.members}
        assert set(state.members) == live
        if state.paused is not None:  # paused: every shard handed back, none installed
            assert not state.owners
        else:
            assert set(state.owners) == set(state.layout.readable_indexes) if live else not state.owners
        for member in state.members.values():
            assert state.member_state(member) is MemberState.STABLE
            assert self.clients[member.member_id].machine.owned == member.assigned
        sizes = [len(m.assigned & state.layout.active_indexes) for m in state.members.values()]
        assert not sizes or max(sizes) - min(sizes) <= 1  # (DRAINING shards stay where they were)

    def stable(self) -> bool:
        state = self.g.state
        honest = {m for m, c in self.clients.items() if not c.crashed}
        if state.holds or state.quarantine:  # not over until what waits for time is done
            return False
        return set(state.members) == honest and all(
            state.member_state(m) is MemberState.STABLE
            and self.clients[m.member_id].incarnation == m.incarnation
            and self.clients[m.member_id].machine.owned == m.assigned
            for m in state.members.values()
        )

    # --- invariants ------------------------------------------------------

    @invariant()
    def nothing_is_due_before_due_ms(self) -> None:
        """The actor sleeps until `due_ms` instead of ticking every interval: a tick any time
        before it must change nothing (now, and the last millisecond before it)."""
        due = group.due_ms(self.g.state, self.g.leases)
        # read member by member (a lease table that is no exact copy of the members takes
        # that path): the same time as the one pass over the table
        assert due == group.due_ms(self.g.state, _MemberByMember(self.g.leases))
        if due is None:
            state = self.g.state
            assert state.deleted or not state.members
            assert state.deleted or not (state.holds or state.quarantine)
            return
        for at in {self.g.now, due - 1}:
            if self.g.now <= at < due:
                assert group.decide(self.g.state, Tick(at, self.g.leases), self.g.level, self.g.leases) == []

    @invariant()
    def handlers_never_overlap(self) -> None:
        """No shard is held by two member processes that may be handling it (their own lease
        not yet past its fence: a paused one may resume before it), zombies and processes of a
        group Redis lost included."""
        now = self.g.now / 1000
        processes = [*self.clients.values(), *(z for zs in self.zombies.values() for z in zs)]
        handling = Counter(s for c in processes if now < c.machine.fence_at for s in c.machine.owned)
        assert all(n == 1 for n in handling.values()), handling

    @invariant()
    def exclusivity(self) -> None:
        state = self.g.state
        counts = Counter(s for m in state.members.values() for s in m.installed)
        assert all(n == 1 for n in counts.values())
        assert dict(state.owners) == {s: m.member_id for m in state.members.values() for s in m.installed}

    @invariant()
    def install_never_before_release(self) -> None:
        for event in self.g.events[self.checked :]:
            match event:
                case ShardsRevokeAcked():
                    self.acked[event.member_id] = event.shards
                case ShardsReleased():
                    assert all(self.holder.get(s) == event.member_id for s in event.shards)
                    if event.reason is ReleaseReason.REVOKE_ACKED:
                        assert self.acked.pop(event.member_id) == event.shards
                    for s in event.shards:
                        del self.holder[s]
                case ShardsInstalled():
                    assert all(s not in self.holder for s in event.shards)
                    self.holder.update(dict.fromkeys(event.shards, event.member_id))
                case MemberJoined() | MemberLeft() | MemberFenced():
                    self.member_epochs.pop(event.member_id, None)
        self.checked = len(self.g.events)

    @invariant()
    def epochs_never_decrease(self) -> None:
        state = self.g.state
        epochs = (state.group_epoch, state.assignment_epoch)
        assert epochs >= self.epochs
        assert state.assignment_epoch <= state.group_epoch
        self.epochs = epochs
        for member_id, member in state.members.items():
            assert member.member_epoch >= self.member_epochs.get(member_id, 0)
            assert member.member_epoch <= state.assignment_epoch
            self.member_epochs[member_id] = member.member_epoch

    @invariant()
    def target_is_a_balanced_partition(self) -> None:
        """Over the staying members, of every readable shard not held for a static member
        (PROTOCOL section 4's balance, with holds excluded)."""
        state = self.g.state
        if state.paused is not None:  # paused by an operator: nobody is targeted anything
            assert not any(state.target.values())
            return
        staying = [m for m, member in state.members.items() if not member.leaving]
        held = state.held()
        held_shards = frozenset().union(*held.values()) if held else frozenset()
        assert all(
            not state.target_of(m) or m in held for m, member in state.members.items() if member.leaving
        )
        assert all(not state.target_of(m) & held_shards for m in staying)  # nobody else reads them
        if state.assignment_epoch != state.group_epoch or not staying:
            return
        targets = [state.target_of(m) for m in staying]
        flat = [s for t in targets for s in t]
        assert len(flat) == len(set(flat))
        assert set(flat) == set(state.layout.readable_indexes) - held_shards
        # Balance counts the ACTIVE shards: a DRAINING one is not new work, it stays put.
        active = [t & state.layout.active_indexes for t in targets]
        assert max(map(len, active)) - min(map(len, active)) <= 1

    @invariant()
    def a_draining_shard_keeps_its_owner(self) -> None:
        """A DRAINING shard never moves to another member while its member stays in the group
        (unless an operator paused the group meanwhile: then every shard is handed back)."""
        state = self.g.state
        if state.paused is not None:
            self._draining_owners = {}
            return
        draining = state.layout.readable_indexes - state.layout.active_indexes
        now = {
            s: (m, member.incarnation)
            for m, member in state.members.items()
            for s in state.target_of(m)
            if s in draining
        }
        before = getattr(self, "_draining_owners", {})
        for shard, (owner, incarnation) in before.items():
            member = state.members.get(owner)
            kept = member is not None and member.incarnation == incarnation and not member.leaving
            if shard in draining and kept:
                assert now.get(shard, ("",))[0] == owner, (shard, owner, now.get(shard))
        self._draining_owners = now

    @invariant()
    def nothing_is_installed_while_quarantined(self) -> None:
        """A shard whose fenced holder may still be running a handler (its lease may run) is
        installed to nobody before that lease can have ended."""
        timed = self.g.timed
        for i in range(self.timed_checked, len(timed)):
            at, event = timed[i]
            match event:
                case ShardsQuarantined():
                    for s in event.shards:
                        self.quarantined[s] = max(self.quarantined.get(s, 0), event.until_ms)
                case QuarantineEnded() if not all(at >= self.quarantined.get(s, 0) for s in event.shards):
                    # Early only for the holder of a group Redis lost, which reported them: it
                    # joined just now and they are installed to it next (`group._claimed`).
                    joined, installed = timed[i - 1][1], timed[i + 1][1]
                    assert isinstance(joined, MemberJoined), timed[i - 1 : i + 2]
                    assert isinstance(installed, ShardsInstalled), timed[i - 1 : i + 2]
                    assert (installed.member_id, installed.shards) == (joined.member_id, event.shards)
                    for s in event.shards:
                        self.quarantined.pop(s, None)
                case ShardsInstalled():
                    assert all(at >= self.quarantined.get(s, 0) for s in event.shards), (at, event)
                case GroupDeleted():  # no member is left; a group created afresh starts clean
                    self.quarantined.clear()
        self.timed_checked = len(timed)

    @invariant()
    def superseded_incarnations_never_hold_anything(self) -> None:
        state = self.g.state
        for member_id, member in state.members.items():
            assert member.incarnation not in state.superseded.get(member_id, ())

    @invariant()
    def fold_of_events_is_the_state(self) -> None:
        assert group.fold(self.g.events) == self.g.state

    @invariant()
    def the_lease_table_holds_exactly_the_live_members(self) -> None:
        assert set(self.g.leases) == set(self.g.state.members)

    @invariant()
    def drain_reports_name_only_draining_shards_their_member_holds(self) -> None:
        state = self.g.state
        draining = {s.index for s in state.layout.draining}
        for member_id, member in state.members.items():
            reported = {r.shard for r in self.g.leases.drain_progress(member_id)}
            assert reported <= (member.assigned | member.revoking) & draining, (member_id, reported)
        for member_id in set(MEMBER_IDS) - set(state.members):
            assert self.g.leases.drain_progress(member_id) == ()


GroupMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGroupMachine = GroupMachine.TestCase

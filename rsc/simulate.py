"""`rsc simulate`: the pure core with simulated members and simulated time.

No Redis, no HTTP, no clock: a seeded random schedule of heartbeats, ticks
and churn (joins, graceful leaves, crashes, restarts, slow revokes, lost
responses, shard-count changes) drives one group aggregate. Each simulated
member is the shipped member machine (`rsc.events.member_machine.MemberMachine`, the
one the trio runtime drives), and the coordinator holds long-poll heartbeats
by the shipped rules (`rsc.events.longpoll`), so what is checked here is
what runs. Observers check the protocol from outside:

* exclusivity: no shard is read by two members that are both live in the
  coordinator at once (a fenced member still reading is counted apart, as
  `staleReaderOverlaps`: that is what data-plane fencing is for);
* order: every install follows the release of the previous holder, and
  every release by revoke follows that member's ack;
* minimal moves: every target computation moves exactly the lower bound;
* convergence: after the churn, every readable shard is read by exactly one
  member, members are stable, and balance holds.

The same seed gives the same output.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from typing import Any

import attrs

from rsc.events import assignor, group, longpoll
from rsc.events.commands import (
    ApplyLayout,
    ChangeShardCount,
    CreateGroup,
    CreateStream,
    GroupCommand,
    Heartbeat,
    Tick,
)
from rsc.events.errors import CoordinationError, IncarnationMismatch
from rsc.events.events import GroupEvent, ShardsInstalled, ShardsReleased, ShardsRevokeAcked
from rsc.events.liveness import Leases
from rsc.events.member_machine import MemberMachine, MemberSettings, Steps
from rsc.events.model import ClientInfo, ReleaseReason, Timing
from rsc.events.respond import respond
from rsc.events.stream import StreamState
from rsc.events.stream import decide as stream_decide
from rsc.events.stream import fold as stream_fold
from rsc.events.versions import MAX_FEATURE_LEVEL
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse

SIM_CLIENT = ClientInfo("rsc-simulate", "1", MAX_FEATURE_LEVEL)
CHURN_KINDS = ("join", "leave", "crash", "slow", "lose", "reshard")
CHURN_WEIGHTS = (30, 20, 15, 15, 15, 5)


@attrs.frozen
class SimConfig:
    members: int = 50
    shards: int = 512
    seed: int = 0
    churn: int = 200
    heartbeat_interval_ms: int = 1_000
    lease_ttl_ms: int = 5_000
    revoke_timeout_ms: int = 15_000
    tick_ms: int = 500
    assignment_interval_ms: int = 0
    churn_spacing_ms: int = 250
    settle_limit_ms: int = 300_000


@attrs.define
class Held:
    """A long poll the simulated coordinator holds."""

    request: HeartbeatRequest
    command: Heartbeat
    first: HeartbeatResponse
    latest: HeartbeatResponse
    deadline: int
    number: int
    woken: bool = False


@attrs.define
class SimMember:
    """One simulated member process: the shipped member machine and the process around it."""

    machine: MemberMachine
    running: bool = True
    slow_until: int = 0  # revokes do not finish before this time
    lose_next: int = 0  # responses still to be lost
    #: The heartbeat event that counts (earlier scheduled ones are stale).
    beat: int = 0
    fences_counted: int = 0
    #: A long poll the coordinator holds now.
    held: Held | None = None

    @property
    def member_id(self) -> str:
        return self.machine.member_id


@attrs.define
class Stats:
    steps: int = 0
    heartbeats: int = 0
    moves: int = 0
    minimal_moves: bool = True
    target_computations: int = 0
    exclusivity_violations: int = 0
    stale_reader_overlaps: int = 0
    order_violations: int = 0
    fenced: int = 0
    lost_responses: int = 0
    self_fenced: int = 0
    long_polls: int = 0
    churn: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(CHURN_KINDS, 0))


class Simulation:
    """A deterministic discrete-event simulation of one group."""

    def __init__(self, config: SimConfig, progress: Callable[[str], None] = lambda _: None) -> None:
        self.config = config
        self.progress = progress
        self.rng = random.Random(config.seed)
        self.now = 0
        self.seq = 0
        self.queue: list[tuple[int, int, str, str]] = []
        self.stats = Stats()
        stream = stream_fold(stream_decide(None, CreateStream("sim", config.shards)))
        assert stream is not None
        self.stream: StreamState = stream
        timing = Timing(
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            lease_ttl_ms=config.lease_ttl_ms,
            revoke_timeout_ms=config.revoke_timeout_ms,
            assignment_interval_ms=config.assignment_interval_ms,
        )
        self.state, _ = group.execute(None, CreateGroup("sim", "sim-group", stream.layout, timing))
        self.members: dict[str, SimMember] = {}
        #: The coordinator's lease table (liveness is kept beside the state, as the actor does).
        self.leases = Leases()
        self.next_member = 0
        self.incarnations = 0
        self.readers: dict[int, set[str]] = {}
        self.reading: dict[str, frozenset[int]] = {}
        self.holder: dict[int, str] = {}
        self.acked: dict[str, frozenset[int]] = {}
        self.revokes: dict[int, tuple[SimMember, frozenset[int]]] = {}
        self.wake_due = False

    # --- scheduling ------------------------------------------------------

    def at(self, time_ms: int, kind: str, arg: str = "") -> None:
        self.seq += 1
        heapq.heappush(self.queue, (time_ms, self.seq, kind, arg))

    def run(self) -> dict[str, Any]:
        """Run joins, churn and settling; return the final report."""
        cfg = self.config
        for _ in range(cfg.members):
            self.at(self.rng.randrange(cfg.heartbeat_interval_ms), "spawn")
        churn_start = 2 * cfg.heartbeat_interval_ms
        for i in range(cfg.churn):
            jitter = self.rng.randrange(cfg.churn_spacing_ms)
            self.at(churn_start + i * cfg.churn_spacing_ms + jitter, "churn")
        churn_end = churn_start + cfg.churn * cfg.churn_spacing_ms
        self.at(0, "tick")
        converged_at: int | None = None
        last_report = -10_000
        while self.queue:
            self.now, _, kind, arg = heapq.heappop(self.queue)
            self.dispatch(kind, arg)
            if kind != "tick":
                continue
            if self.now - last_report >= 10_000:
                last_report = self.now
                self.progress(self.status_line())
            if self.now > churn_end and self.converged():
                converged_at = self.now
                break
            if self.now > churn_end + cfg.settle_limit_ms:
                break
        self.progress(self.status_line())
        return self.report(converged_at, churn_end)

    def dispatch(self, kind: str, arg: str) -> None:
        match kind:
            case "spawn":
                self.spawn()
            case "heartbeat":
                self.heartbeat(arg)
            case "tick":
                self.execute(Tick(self.now, self.leases))
                self.at(self.now + self.config.tick_ms, "tick")
            case "churn":
                self.churn()
            case "restart":
                self.restart(arg)
            case "revoked":
                self.revoked(int(arg))
            case "wake":
                self.wake_held()
            case "held":
                self.held_ends(arg)

    # --- the coordinator side ----------------------------------------------

    def execute(self, command: GroupCommand) -> list[GroupEvent]:
        before = self.state.target
        self.state, events = group.execute(self.state, command)
        self.leases.apply(events)
        self.stats.steps += 1
        self.observe(events, before)
        change = longpoll.change_of(events)
        if change is not None:  # the held long polls it concerns are decided again, after this step
            for member in self.members.values():
                held = member.held
                if held and longpoll.concerns(change, member.member_id, held.latest.assignment.pending):
                    held.woken = True
                    if not self.wake_due:
                        self.wake_due = True
                        self.at(self.now, "wake")
        return events

    def observe(self, events: list[GroupEvent], previous_target: Any) -> None:
        """Check handoff order on the emitted events and count target moves."""
        for event in events:
            match event:
                case ShardsRevokeAcked():
                    self.acked[event.member_id] = event.shards
                case ShardsReleased():
                    if any(self.holder.get(s) != event.member_id for s in event.shards):
                        self.stats.order_violations += 1
                    if event.reason is ReleaseReason.REVOKE_ACKED and self.acked.pop(
                        event.member_id, None
                    ) != (event.shards):
                        self.stats.order_violations += 1
                    for s in event.shards:
                        self.holder.pop(s, None)
                    if event.reason is ReleaseReason.FENCED:
                        self.stats.fenced += 1
                case ShardsInstalled():
                    if any(s in self.holder for s in event.shards):
                        self.stats.order_violations += 1
                    self.holder.update(dict.fromkeys(event.shards, event.member_id))
        if any(type(e).__name__ == "TargetAssignmentUpdated" for e in events):
            members = self.state.members
            # a leaving member is not in the target any more: its shards are free, not moved
            target = {m: s for m, s in self.state.target.items() if m in members and not members[m].leaving}
            shards = self.state.layout.readable_indexes
            moved = assignor.moves(previous_target, target)
            self.stats.moves += moved
            self.stats.target_computations += 1
            if moved != assignor.minimal_moves(list(target), shards, previous_target):
                self.stats.minimal_moves = False

    # --- the member side -------------------------------------------------

    def spawn(self) -> None:
        index = self.next_member
        self.next_member += 1
        member_id = f"10.{index // 65536}.{index // 256 % 256}.{index % 256}/sim/0"
        self.start_member(member_id)

    def start_member(self, member_id: str) -> None:
        self.incarnations += 1
        cfg = self.config
        settings = MemberSettings(
            heartbeat_interval_ms=cfg.heartbeat_interval_ms, lease_ttl_ms=cfg.lease_ttl_ms
        )
        machine = MemberMachine(
            "sim", "sim-group", member_id, f"inc-{self.incarnations}", SIM_CLIENT, settings
        )
        self.members[member_id] = SimMember(machine)
        self.schedule(self.members[member_id])

    @property
    def seconds(self) -> float:
        return self.now / 1000

    def schedule(self, member: SimMember) -> None:
        """The member's next heartbeat, when its machine says (earlier ones become stale)."""
        if member.machine.left:  # the process exits
            if self.members.get(member.member_id) is member:
                del self.members[member.member_id]
            self.set_reading(member, frozenset())
            return
        due = member.machine.next_heartbeat_at(self.seconds)
        if due == float("inf") or member.held is not None:
            return
        member.beat += 1
        self.at(max(self.now, math.ceil(due * 1000)), "heartbeat", f"{member.member_id}#{member.beat}")

    def heartbeat(self, arg: str) -> None:
        member_id, beat = arg.rsplit("#", 1)
        member = self.members.get(member_id)
        if member is None or not member.running or member.beat != int(beat) or member.held:
            return
        machine = member.machine
        self.perform(member, machine.silent(self.seconds))
        request = machine.request(self.seconds)
        command = request.to_command(self.now)
        self.stats.heartbeats += 1
        try:
            events = self.execute(command)
        except IncarnationMismatch as exc:  # the previous incarnation's lease has not ended yet
            self.perform(member, machine.failed(request, self.seconds, str(exc)))
            self.schedule(member)
            return
        response = respond(self.state, command, events)
        if longpoll.should_hold(request, response):
            self.stats.long_polls += 1
            deadline = self.now + longpoll.hold_ms(request, response)
            self.seq += 1
            member.held = Held(request, command, response, response, deadline, self.seq)
            self.at(deadline, "held", f"{member_id}#{self.seq}")
            return
        self.deliver(member, request, response)

    def deliver(self, member: SimMember, request: HeartbeatRequest, response: HeartbeatResponse) -> None:
        machine = member.machine
        if member.lose_next > 0:
            member.lose_next -= 1
            self.stats.lost_responses += 1
            self.perform(member, machine.failed(request, self.seconds, "response lost"))
        else:
            self.perform(member, machine.receive(request, response, self.seconds))
        self.schedule(member)

    def wake_held(self) -> None:
        self.wake_due = False
        for member_id in sorted(m for m, s in self.members.items() if s.held and s.held.woken):
            self.answer_held(member_id)

    def held_ends(self, arg: str) -> None:
        member_id, number = arg.rsplit("#", 1)
        member = self.members.get(member_id)
        if member is not None and member.held is not None and member.held.number == int(number):
            self.answer_held(member_id)

    def answer_held(self, member_id: str) -> None:
        """Decide a held long poll again; answer it if that says something new or time is up."""
        member = self.members.get(member_id)
        held = member.held if member is not None else None
        if member is None or held is None or not member.running:
            return
        held.woken = False
        again = longpoll.again(held.command, held.latest, self.now)
        try:
            events = self.execute(again)
            latest = respond(self.state, again, events)
        except CoordinationError:  # it moved on: the answer stands as it was
            member.held = None
            self.deliver(member, held.request, held.latest)
            return
        if self.now < held.deadline and not longpoll.worth_answering(held.first, latest):
            held.command, held.latest = again, latest
            return
        member.held = None
        self.deliver(member, held.request, latest)

    def perform(self, member: SimMember, steps: Steps) -> None:
        """What the member's shell does: read what it owns, and finish revokes after a while."""
        self.stats.self_fenced += member.machine.self_fenced - member.fences_counted
        member.fences_counted = member.machine.self_fenced
        if steps.stop:
            self.seq += 1
            self.revokes[self.seq] = (member, steps.stop)
            done = max(self.now + self.rng.randrange(1, 200), member.slow_until)
            self.at(done, "revoked", str(self.seq))
        self.set_reading(member, member.machine.owned)

    def revoked(self, token: int) -> None:
        member, shards = self.revokes.pop(token)
        if not member.running or self.members.get(member.member_id) is not member:
            return
        self.perform(member, member.machine.revoked(shards))
        self.schedule(member)  # acknowledge now

    def set_reading(self, member: SimMember, shards: frozenset[int]) -> None:
        member_id = member.member_id
        before = self.reading.get(member_id, frozenset())
        for s in before - shards:
            self.readers[s].discard(member_id)
        for s in shards - before:
            others = self.readers.setdefault(s, set())
            for other in others:
                if self.live(other) and self.live(member_id):
                    self.stats.exclusivity_violations += 1
                else:
                    self.stats.stale_reader_overlaps += 1
            others.add(member_id)
        self.reading[member_id] = shards

    def live(self, member_id: str) -> bool:
        live = self.state.members.get(member_id)
        member = self.members.get(member_id)
        return live is not None and member is not None and live.incarnation == member.machine.incarnation

    # --- churn -----------------------------------------------------------

    def churn(self) -> None:
        kind = self.rng.choices(CHURN_KINDS, CHURN_WEIGHTS)[0]
        running = sorted(m for m, s in self.members.items() if s.running and not s.machine.leaving)
        if kind not in {"join", "reshard"} and not running:
            kind = "join"
        self.stats.churn[kind] += 1
        match kind:
            case "join":
                self.spawn()
            case "leave":  # graceful: revoke everything while heartbeating, then the leave
                member = self.members[self.rng.choice(running)]
                self.perform(member, member.machine.stop())
                self.schedule(member)
            case "crash":
                member = self.members[self.rng.choice(running)]
                member.running = False
                member.held = None  # its connection is gone with it
                self.set_reading(member, frozenset())
                if self.rng.random() < 0.5:
                    self.at(
                        self.now + self.rng.randrange(2 * self.config.lease_ttl_ms),
                        "restart",
                        member.member_id,
                    )
            case "slow":
                member = self.members[self.rng.choice(running)]
                member.slow_until = self.now + self.rng.randrange(2 * self.config.revoke_timeout_ms)
            case "lose":
                self.members[self.rng.choice(running)].lose_next = self.rng.randint(1, 3)
            case "reshard":
                self.reshard()

    def restart(self, member_id: str) -> None:
        member = self.members.get(member_id)
        if member is None or member.running:
            return
        self.start_member(member_id)

    def reshard(self) -> None:
        count = self.stream.shard_count + self.rng.randint(1, max(1, self.stream.shard_count // 4))
        events = stream_decide(self.stream, ChangeShardCount(count))
        stream = stream_fold(events, self.stream)
        assert stream is not None
        self.stream = stream
        self.execute(ApplyLayout(stream.layout, self.now))

    # --- verdicts --------------------------------------------------------

    def converged(self) -> bool:
        state = self.state
        running = {m for m, s in self.members.items() if s.running}
        if set(state.members) != running or state.group_epoch != state.assignment_epoch:
            return False
        for member in state.members.values():
            sim = self.members[member.member_id].machine
            if member.revoking or state.pending_of(member) or sim.owned != member.assigned or sim.to_ack:
                return False
        read = {s for s, r in self.readers.items() if r}
        return read == set(state.layout.readable_indexes) and self.imbalance() <= 1

    def imbalance(self) -> int:
        sizes = [len(m.assigned) for m in self.state.members.values()]
        return max(sizes) - min(sizes) if sizes else 0

    def status_line(self) -> str:
        s = self.state
        return (
            f"t={self.now / 1000:>7.1f}s members={len(s.members):>5} "
            f"shards={len(s.layout.readable_indexes):>5} groupEpoch={s.group_epoch} "
            f"assignmentEpoch={s.assignment_epoch} "
            f"heartbeats={self.stats.heartbeats} moves={self.stats.moves} fenced={self.stats.fenced}"
        )

    def report(self, converged_at: int | None, churn_end: int) -> dict[str, Any]:
        st = self.stats
        return {
            "converged": converged_at is not None,
            "convergedAfterChurnMs": None if converged_at is None else converged_at - churn_end,
            "simulatedMs": self.now,
            "steps": st.steps,
            "heartbeats": st.heartbeats,
            "members": len(self.state.members),
            "shards": len(self.state.layout.readable_indexes),
            "groupEpoch": self.state.group_epoch,
            "targetComputations": st.target_computations,
            "moves": st.moves,
            "minimalMoves": st.minimal_moves,
            "maxImbalance": self.imbalance(),
            "exclusivityViolations": st.exclusivity_violations,
            "orderViolations": st.order_violations,
            "staleReaderOverlaps": st.stale_reader_overlaps,
            "fenced": st.fenced,
            "selfFenced": st.self_fenced,
            "longPolls": st.long_polls,
            "lostResponses": st.lost_responses,
            "churn": st.churn,
            "seed": self.config.seed,
        }

"""`rsc simulate`: the pure core with simulated members and simulated time.

No Redis, no HTTP, no clock: a seeded random schedule of heartbeats, ticks
and churn (joins, graceful leaves, crashes, restarts, slow revoke acks, lost
responses, shard-count changes) drives one group aggregate, and observers
check the protocol from outside:

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

import contextlib
import heapq
import random
from collections.abc import Callable
from typing import Any

import attrs

from rsc.events import assignor, group
from rsc.events.commands import (
    ApplyLayout,
    ChangeShardCount,
    CreateGroup,
    CreateStream,
    GroupCommand,
    Heartbeat,
    Tick,
)
from rsc.events.errors import IncarnationMismatch
from rsc.events.events import GroupEvent, ShardsInstalled, ShardsReleased, ShardsRevokeAcked
from rsc.events.liveness import Leases
from rsc.events.model import HeartbeatStatus, ReleaseReason, Timing
from rsc.events.respond import respond
from rsc.events.stream import StreamState
from rsc.events.stream import decide as stream_decide
from rsc.events.stream import fold as stream_fold
from rsc.events.wire import HeartbeatResponse

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
class SimMember:
    """One simulated member process and what it believes."""

    member_id: str
    incarnation: str
    epoch: int = 0
    owned: frozenset[int] = frozenset()  # the shards it reads now
    to_ack: frozenset[int] = frozenset()
    running: bool = True
    slow_until: int = 0  # does not ack revokes before this time
    lose_next: int = 0  # responses still to be lost
    last_success_sent_ms: int = 0


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
        self.holder: dict[int, str] = {}
        self.acked: dict[str, frozenset[int]] = {}

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

    # --- the coordinator side ----------------------------------------------

    def execute(self, command: GroupCommand) -> list[GroupEvent]:
        before = self.state.target
        self.state, events = group.execute(self.state, command)
        self.leases.apply(events)
        self.stats.steps += 1
        self.observe(events, before)
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
            target = self.state.target
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
        self.incarnations += 1
        self.members[member_id] = SimMember(member_id, f"inc-{self.incarnations}")
        self.at(self.now, "heartbeat", member_id)

    def heartbeat(self, member_id: str) -> None:
        member = self.members.get(member_id)
        if member is None or not member.running:
            return
        self.self_fence_if_silent(member)
        acking = member.to_ack if self.now >= member.slow_until else frozenset()
        command = Heartbeat(
            member_id=member_id,
            incarnation=member.incarnation,
            member_epoch=member.epoch,
            now_ms=self.now,
            metadata_version=self.state.layout.metadata_version,
            owned=member.owned - acking,
            revoked=acking,
        )
        self.set_reading(member, member.owned - acking)
        self.stats.heartbeats += 1
        try:
            events = self.execute(command)
        except IncarnationMismatch:  # the previous incarnation's lease has not ended yet
            self.at(self.now + self.config.heartbeat_interval_ms, "heartbeat", member_id)
            return
        if member.lose_next > 0:
            member.lose_next -= 1
            self.stats.lost_responses += 1
        else:
            self.learn(member, respond(self.state, command, events))
        interval = self.config.heartbeat_interval_ms
        self.at(self.now + interval - self.rng.randrange(interval // 10 + 1), "heartbeat", member_id)

    def learn(self, member: SimMember, response: HeartbeatResponse) -> None:
        if response.status in (HeartbeatStatus.FENCED, HeartbeatStatus.UNKNOWN_MEMBER):
            member.epoch, member.to_ack = 0, frozenset()
            self.set_reading(member, frozenset())
            return
        member.last_success_sent_ms = self.now
        member.epoch = response.member_epoch
        member.to_ack = response.assignment.revoke
        # It keeps reading shards it must revoke until it acks them.
        self.set_reading(member, response.assignment.assigned | (member.owned & response.assignment.revoke))

    def self_fence_if_silent(self, member: SimMember) -> None:
        """No successful response within the lease (less a margin): stop reading everything."""
        margin = self.config.lease_ttl_ms // 5
        if member.owned and self.now - member.last_success_sent_ms > self.config.lease_ttl_ms - margin:
            self.stats.self_fenced += 1
            self.set_reading(member, frozenset())
            member.epoch, member.to_ack = 0, frozenset()

    def set_reading(self, member: SimMember, shards: frozenset[int]) -> None:
        for s in member.owned - shards:
            self.readers[s].discard(member.member_id)
        for s in shards - member.owned:
            others = self.readers.setdefault(s, set())
            for other in others:
                if self.live(other) and self.live(member.member_id):
                    self.stats.exclusivity_violations += 1
                else:
                    self.stats.stale_reader_overlaps += 1
            others.add(member.member_id)
        member.owned = shards

    def live(self, member_id: str) -> bool:
        live = self.state.members.get(member_id)
        member = self.members.get(member_id)
        return live is not None and member is not None and live.incarnation == member.incarnation

    # --- churn -----------------------------------------------------------

    def churn(self) -> None:
        kind = self.rng.choices(CHURN_KINDS, CHURN_WEIGHTS)[0]
        running = sorted(m for m, s in self.members.items() if s.running)
        if kind not in {"join", "reshard"} and not running:
            kind = "join"
        self.stats.churn[kind] += 1
        match kind:
            case "join":
                self.spawn()
            case "leave":
                member = self.members.pop(self.rng.choice(running))
                self.set_reading(member, frozenset())
                with contextlib.suppress(IncarnationMismatch):  # a restart whose old self is still live
                    self.execute(Heartbeat(member.member_id, member.incarnation, -1, self.now))
            case "crash":
                member = self.members[self.rng.choice(running)]
                member.running = False
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
        self.incarnations += 1
        self.members[member_id] = SimMember(
            member_id, f"inc-{self.incarnations}", last_success_sent_ms=self.now
        )
        self.at(self.now, "heartbeat", member_id)

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
            sim = self.members[member.member_id]
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
            "lostResponses": st.lost_responses,
            "churn": st.churn,
            "seed": self.config.seed,
        }

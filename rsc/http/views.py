"""Monitoring views: what operators read, built from aggregate state.

Plain attrs values rendered by the codec (camelCase JSON); no logic beyond
arranging what the state already says. Leases are not in the state: the
views read them from the lease table of the actor that owns the aggregate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from rsc import __version__
from rsc.actors.deployment import GroupLag, ShardStats
from rsc.actors.deployment import PendingEntry as Pending
from rsc.events.drain import DrainEvidence, GroupDrain, drained
from rsc.events.group import GroupState
from rsc.events.liveness import Leases
from rsc.events.migration import waiting_for
from rsc.events.model import (
    ClientInfo,
    DrainProgress,
    GroupConfig,
    Layout,
    MemberState,
    MigrationBounds,
    MigrationPhase,
    PauseState,
    PhaseStarted,
    ReshardMode,
    ShardState,
    Stall,
)
from rsc.events.retention import KEEP_ALL, Retention
from rsc.events.stream import StreamState
from rsc.events.stream_state import stale_producers
from rsc.events.versions import (
    FEATURE_LEVELS,
    MAX_FEATURE_LEVEL,
    MAX_JOURNAL_SCHEMA,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    PROTOCOLS,
    FeatureLevel,
    ProtocolVersion,
)
from rsc.events.wire import omitted_unless_set


@attrs.frozen
class ShardView:
    index: int
    key: str
    state: ShardState


@attrs.frozen
class RoutingView:
    """What a producer needs to route: the active shards in routing order."""

    stream_prefix: str
    metadata_version: int
    routing: str
    shard_count: int
    shards: tuple[ShardView, ...]
    paused: bool = False


@attrs.frozen
class ShardStatusView:
    """A shard with what Redis says about it (`primaryNode` only on a cluster)."""

    index: int
    key: str
    state: ShardState
    length: int | None = None
    primary_node: str | None = None
    groups: tuple[GroupLag, ...] = ()
    #: A DRAINING shard's drain evidence, as the coordinator reads it before retiring it.
    drain: DrainStatusView | None = None


@attrs.frozen
class DrainStatusView:
    """What keeps a DRAINING shard from retiring, if anything: its seal, each consumer group's
    pending and undelivered entries, and the producers not yet on the current layout."""

    sealed: bool
    drained: bool
    groups: tuple[GroupDrain, ...]
    waiting_for_producers: tuple[str, ...]


@attrs.frozen
class ProducerView:
    """A registered producer: the layout version it routes with, and whether it is quiesced."""

    producer_id: str
    acked_version: int
    up_to_date: bool
    quiesced: bool
    lease_left_ms: int
    client: ClientInfo
    registered_at_ms: int


@attrs.frozen
class ProducersSummary:
    """How many live producers route with the current layout, and how many are quiesced."""

    live: int
    acked_current_version: int
    quiesced: int


@attrs.frozen
class MigrationView:
    """The running resharding, or the last one (DONE, ABORTED) until the next begins.

    `phases`: each phase entered and when; `inPhaseMs`: how long the current one has lasted
    (0 once final); `deadlineMs`: when the current phase stops (stalls) if
    it has not moved on; `stalled`: why it stopped, until an operator resumes or aborts it;
    `waitingForProducers`: the producers it waits for now (not quiesced while PAUSING or
    QUIESCED, not on the current layout while SWITCHING or DRAINING); `producerVersions`:
    the layout version each live producer routes with; `drainingShards`: the DRAINING
    shards (their evidence is in `shards[].drain`); `waitingForGroups`: while QUIESCED, each
    group that has not yet consumed and acknowledged everything, with the shards where it
    has entries pending or undelivered (or where it is missing), as Redis shows it now."""

    migration_id: int
    mode: ReshardMode
    from_shard_count: int
    to_shard_count: int
    from_version: int
    phase: MigrationPhase
    phases: tuple[PhaseStarted, ...]
    started_at_ms: int
    in_phase_ms: int
    deadline_ms: int | None
    stalled: Stall | None
    paused_producers: bool
    supersedes: int | None
    outcome: str
    bounds: MigrationBounds
    waiting_for_producers: tuple[str, ...]
    producer_versions: Mapping[str, int]
    draining_shards: tuple[int, ...]
    waiting_for_groups: Mapping[str, tuple[int, ...]] = attrs.field(factory=dict)


@attrs.frozen
class StreamView:
    stream_prefix: str
    metadata_version: int
    routing: str
    shard_count: int
    shards: tuple[ShardStatusView, ...]
    groups: tuple[str, ...]
    shards_per_primary: Mapping[str, int] = attrs.field(factory=dict)
    paused: PauseState | None = None
    producers: tuple[ProducerView, ...] = ()
    producers_summary: ProducersSummary = ProducersSummary(0, 0, 0)
    migration: MigrationView | None = None
    #: The retention policy the coordinator applies (a stream without one keeps everything).
    retention: Retention = KEEP_ALL


@attrs.frozen
class StreamSummary:
    stream_prefix: str
    metadata_version: int
    shard_count: int
    groups: tuple[str, ...]


@attrs.frozen
class MemberView:
    """One member as operators see it. Never its incarnation: that, with the member id,
    is what drives the member, so a view must not hand it out."""

    member_id: str
    member_epoch: int
    state: MemberState
    lease_left_ms: int
    assigned: frozenset[int]
    pending: frozenset[int]
    revoking: frozenset[int]
    revoking_since_ms: int | None
    client: ClientInfo
    joined_at_ms: int
    #: What the member reported in its last heartbeat on the DRAINING shards assigned to it.
    drain_progress: tuple[DrainProgress, ...] = ()
    #: A static member (feature level 4).
    static: bool = False
    #: What it reported reading (`ownedShards`) in its last heartbeat: `assigned` plus the
    #: shards it has not acknowledged handing over yet, unless something is wrong with it.
    owned: frozenset[int] = frozenset()


@attrs.frozen
class HoldView:
    """A member that stopped and what is kept for it until `untilMs`: static, its shards wait
    for it (read by nobody); otherwise a memory, given back if it rejoins soon."""

    member_id: str
    shards: frozenset[int]
    until_ms: int
    static: bool


@attrs.frozen
class QuarantineView:
    """Shards installed to nobody until `untilMs`: the member fenced from them may still be
    running a handler until its lease ends."""

    shards: frozenset[int]
    until_ms: int


@attrs.frozen
class RevokeProgress:
    member_id: str
    shards: frozenset[int]
    since_ms: int | None
    deadline_ms: int | None


@attrs.frozen
class GroupView:
    stream_prefix: str
    consumer_group: str
    group_epoch: int
    assignment_epoch: int
    metadata_version: int
    members: tuple[MemberView, ...]
    target_assignment: Mapping[str, frozenset[int]]
    current_assignment: Mapping[str, str]
    revoke_progress: tuple[RevokeProgress, ...]
    config: GroupConfig
    holds: tuple[HoldView, ...] = ()
    quarantines: tuple[QuarantineView, ...] = ()
    #: Entries retention removed before the group acknowledged them (never delivered, or
    #: delivered and pending), in all and per shard index with a loss (feature level 5).
    trimmed_unseen: int = 0
    trimmed_unseen_per_shard: Mapping[str, int] = attrs.field(factory=dict)
    #: Paused by an operator (feature level 7): no member holds a shard, nothing is delivered;
    #: why and since when (null while not paused).
    paused: bool = False
    paused_reason: str | None = None
    paused_at_ms: int | None = None
    #: Only when asked for a page of members (`limit`): the next page's cursor, null on the last.
    next_cursor: str | None = omitted_unless_set()


@attrs.frozen
class ProtocolRange:
    min: int
    max: int


@attrs.frozen
class Lifecycle:
    status: str
    deprecated_after: str | None = None
    end_of_life: str | None = None


@attrs.frozen
class FeaturesView:
    """The deployment's finalized feature level (None: Redis did not answer), the highest level
    whose data has been written (it cannot be lowered below that), and what this server supports."""

    finalized: int | None
    written: int | None
    supported: ProtocolRange
    levels: tuple[FeatureLevel, ...]


@attrs.frozen
class VersionView:
    """`protocol`: the versions spoken; `protocols`: each one's lifecycle; `lifecycle`: that of
    the newest; `schemaVersion`: the newest journal schema this server reads."""

    server_version: str
    protocol: ProtocolRange
    schema_version: int
    lifecycle: Lifecycle
    protocols: tuple[ProtocolVersion, ...]
    features: FeaturesView


def shard_views(layout: Layout, active_only: bool = False) -> tuple[ShardView, ...]:
    shards = layout.active if active_only else layout.shards
    return tuple(ShardView(s.index, s.key, s.state) for s in shards)


def routing_view(state: StreamState) -> RoutingView:
    layout = state.layout
    return RoutingView(
        state.stream_prefix,
        layout.metadata_version,
        layout.routing,
        state.shard_count,
        shard_views(layout, True),
        paused=state.paused is not None,
    )


def producer_views(state: StreamState, leases: Mapping[str, int], now_ms: int) -> tuple[ProducerView, ...]:
    version = state.layout.metadata_version
    return tuple(
        ProducerView(
            producer_id=p.producer_id,
            acked_version=p.acked_version,
            up_to_date=p.acked_version == version,
            quiesced=p.quiesced,
            lease_left_ms=max(0, leases.get(p.producer_id, 0) - now_ms),
            client=p.client,
            registered_at_ms=p.registered_at_ms,
        )
        for p in sorted(state.producers.values(), key=lambda p: p.producer_id)
    )


def stream_view(
    state: StreamState,
    leases: Mapping[str, int],
    now_ms: int,
    stats: Mapping[str, ShardStats] | None = None,
    evidence: Mapping[str, DrainEvidence] | None = None,
    consumed: Mapping[str, DrainEvidence] | None = None,
) -> StreamView:
    """The layout and producers (leases from `leases`), with Redis figures per shard when `stats`
    is given, the drain evidence of DRAINING shards when `evidence` is, and what a QUIESCED
    migration waits for when `consumed` (the evidence of every readable shard) is."""
    layout = state.layout
    stats = stats or {}
    evidence = evidence or {}
    waiting = tuple(stale_producers(state))
    shards = []
    per_primary: dict[str, int] = {}
    for shard in layout.shards:
        found = stats.get(shard.key)
        seen = evidence.get(shard.key)
        drain = None
        if seen is not None:
            drain = DrainStatusView(seen.sealed, drained(seen, state.groups), seen.groups, waiting)
        if found is None:
            shards.append(ShardStatusView(shard.index, shard.key, shard.state, drain=drain))
            continue
        node = found.primary_node
        shards.append(
            ShardStatusView(shard.index, shard.key, shard.state, found.length, node, found.groups, drain)
        )
        if node is not None and shard.state is ShardState.ACTIVE:
            per_primary[node] = per_primary.get(node, 0) + 1
    producers = producer_views(state, leases, now_ms)
    return StreamView(
        state.stream_prefix,
        layout.metadata_version,
        layout.routing,
        state.shard_count,
        tuple(shards),
        tuple(sorted(state.groups)),
        dict(sorted(per_primary.items())),
        state.paused,
        producers,
        ProducersSummary(
            len(producers), sum(p.up_to_date for p in producers), sum(p.quiesced for p in producers)
        ),
        migration_view(state, now_ms, consumed),
        state.policy,
    )


def waiting_groups(state: StreamState, consumed: Mapping[str, DrainEvidence]) -> dict[str, tuple[int, ...]]:
    """Group -> the readable shards where it has entries pending or undelivered, or is missing."""
    waiting: dict[str, list[int]] = {}
    for shard in state.layout.shards:
        seen = consumed.get(shard.key)
        if seen is None or not shard.readable or not seen.exists:
            continue
        found = {g.group: g for g in seen.groups}
        # The stream's groups, and any other Redis consumer group on the key (the evidence
        # waits for every one of them).
        for group in sorted(set(state.groups) | set(found)):
            g = found.get(group)
            if g is None or g.pending or g.undelivered:
                waiting.setdefault(group, []).append(shard.index)
    return {group: tuple(shards) for group, shards in waiting.items()}


def migration_view(
    state: StreamState, now_ms: int, consumed: Mapping[str, DrainEvidence] | None = None
) -> MigrationView | None:
    m = state.migration
    if m is None:
        return None
    current = m.phases[-1]
    return MigrationView(
        migration_id=m.migration_id,
        mode=m.mode,
        from_shard_count=m.from_count,
        to_shard_count=m.to_count,
        from_version=m.from_version,
        phase=m.phase,
        phases=m.phases,
        started_at_ms=m.started_at_ms,
        in_phase_ms=max(0, now_ms - current.at_ms) if m.running else 0,
        deadline_ms=m.deadline_ms,
        stalled=m.stalled,
        paused_producers=m.paused_producers,
        supersedes=m.supersedes,
        outcome=m.outcome,
        bounds=m.bounds,
        waiting_for_producers=tuple(waiting_for(state)),
        producer_versions={p: state.producers[p].acked_version for p in sorted(state.producers)},
        draining_shards=tuple(s.index for s in state.layout.draining),
        waiting_for_groups=waiting_groups(state, consumed) if consumed is not None else {},
    )


def stream_summary(state: StreamState) -> StreamSummary:
    return StreamSummary(
        state.stream_prefix, state.layout.metadata_version, state.shard_count, tuple(sorted(state.groups))
    )


def group_view(state: GroupState, leases: Leases, now_ms: int) -> GroupView:
    members = tuple(
        MemberView(
            member_id=m.member_id,
            member_epoch=m.member_epoch,
            state=state.member_state(m),
            lease_left_ms=max(0, leases.get(m.member_id, 0) - now_ms),
            assigned=m.assigned,
            pending=state.pending_of(m),
            revoking=m.revoking,
            revoking_since_ms=m.revoking_since_ms,
            client=m.client,
            joined_at_ms=m.joined_at_ms,
            drain_progress=leases.drain_progress(m.member_id),
            static=m.static,
            owned=leases.owned(m.member_id),
        )
        for m in sorted(state.members.values(), key=lambda m: m.member_id)
    )
    until: dict[int, set[int]] = {}
    for shard, at in state.quarantine.items():
        if at > now_ms:
            until.setdefault(at, set()).add(shard)
    revokes = tuple(
        RevokeProgress(m.member_id, m.revoking, m.revoking_since_ms, m.revoke_deadline_ms)
        for m in sorted(state.members.values(), key=lambda m: m.member_id)
        if m.revoking
    )
    return GroupView(
        stream_prefix=state.stream_prefix,
        consumer_group=state.group,
        group_epoch=state.group_epoch,
        assignment_epoch=state.assignment_epoch,
        metadata_version=state.layout.metadata_version,
        members=members,
        target_assignment=dict(sorted(state.target.items())),
        current_assignment={str(s): m for s, m in sorted(state.owners.items())},
        revoke_progress=revokes,
        config=state.config,
        holds=tuple(HoldView(m, h.shards, h.until_ms, h.static) for m, h in sorted(state.holds.items())),
        quarantines=tuple(QuarantineView(frozenset(s), at) for at, s in sorted(until.items())),
        paused=state.paused is not None,
        paused_reason=None if state.paused is None else state.paused.reason,
        paused_at_ms=None if state.paused is None else state.paused.since_ms,
    )


def members_page(view: GroupView, members: Sequence[MemberView], next_cursor: str | None) -> GroupView:
    """`view` cut to a page of its `members`: their targets, the shards they hold, their revokes
    and holds (the group's epochs, config and quarantines stay whole)."""
    ids = {m.member_id for m in members}
    return attrs.evolve(
        view,
        members=tuple(members),
        target_assignment={m: s for m, s in view.target_assignment.items() if m in ids},
        current_assignment={s: m for s, m in view.current_assignment.items() if m in ids},
        revoke_progress=tuple(r for r in view.revoke_progress if r.member_id in ids),
        holds=tuple(h for h in view.holds if h.member_id in ids),
        next_cursor=next_cursor,
    )


def version_view(finalized: int | None = None, written: int | None = None) -> VersionView:
    newest = next(p for p in PROTOCOLS if p.version == PROTOCOL_VERSION)
    return VersionView(
        server_version=__version__,
        protocol=ProtocolRange(MIN_PROTOCOL_VERSION, PROTOCOL_VERSION),
        schema_version=MAX_JOURNAL_SCHEMA,
        lifecycle=Lifecycle(newest.status, newest.deprecated_after, newest.end_of_life),
        protocols=PROTOCOLS,
        features=FeaturesView(finalized, written, ProtocolRange(1, MAX_FEATURE_LEVEL), FEATURE_LEVELS),
    )


@attrs.frozen
class PendingView:
    """One entry a group has delivered and not acknowledged: its shard, id, the member it was
    delivered to, its age (since its id's time) and idle time (since its last delivery) in ms,
    how many times it was delivered, and (the admin's view only) its fields."""

    shard: int
    key: str
    id: str
    member: str
    age_ms: int
    idle_ms: int
    deliveries: int
    fields: Mapping[str, str] | None = omitted_unless_set()


@attrs.frozen
class PendingList:
    """A group's oldest pending entries, oldest first."""

    stream_prefix: str
    consumer_group: str
    entries: tuple[PendingView, ...]


def pending_list(stream_prefix: str, group: str, pending: Sequence[Pending], now_ms: int) -> PendingList:
    """The view of `admin_queries.oldest_pending`'s answer."""
    entries = tuple(
        PendingView(
            p.shard.index,
            p.shard.key,
            p.entry.id,
            p.entry.consumer,
            max(0, now_ms - int(p.entry.id.split("-")[0])),
            p.entry.idle_ms,
            p.entry.deliveries,
            p.fields,
        )
        for p in pending
    )
    return PendingList(stream_prefix, group, entries)

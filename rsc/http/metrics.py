"""Prometheus metrics: heartbeat latency, handoffs, and live figures read from the actors at scrape time."""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import trio
from prometheus_client import PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rsc.actors.deployment import DATA_LOSS, KINDS, Deployment
from rsc.actors.errors import OOM_REFUSALS, StoreError
from rsc.events import quotas
from rsc.events.auth import Scope
from rsc.events.errors import CoordinationError, QuotaExceeded
from rsc.events.events import (
    GroupEvent,
    MemberFenced,
    ShardsInstalled,
    ShardsRevokeRequested,
    TargetAssignmentUpdated,
)
from rsc.events.group import GroupState
from rsc.events.model import Layout, MemberState, MigrationPhase, Shard, ShardState
from rsc.events.stream import StreamState
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from rsc.http import ratelimit

log = logging.getLogger("rsc.metrics")
#: How often shard lengths, per-group lag and pending, and dead letters are read from Redis.
SAMPLE_EVERY_S = 10.0
#: `rsc_heartbeat_seconds`'s buckets (s): fine between 5 and 100 ms, where a batch's goals are.
HEARTBEAT_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025)
HEARTBEAT_BUCKETS += (0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
#: The most of the time sampling may take: a sample that took 1 s waits 19 s before the next.
SAMPLE_SHARE = 0.05
#: The interval stretches to at most this many times `metrics_sample_interval_ms`.
SAMPLE_STRETCH_MAX = 6


@attrs.frozen
class ShardSample:
    """What Redis said about one shard at the last sample."""

    stream: str
    shard: int
    length: int
    #: group -> (pending, lag; None when XINFO cannot tell)
    groups: dict[str, tuple[int, int | None]]
    dead_letters: int


class Metrics:
    """One Prometheus registry per app (so several apps can share a process)."""

    def __init__(self, deployment: Deployment) -> None:
        self.prometheus = CollectorRegistry()
        self.prometheus.register(PROCESS_COLLECTOR)
        self.prometheus.register(PLATFORM_COLLECTOR)
        #: The last sample of every readable shard of the streams whose layout is known here.
        self.samples: dict[tuple[str, int], ShardSample] = {}
        #: Stream prefix -> its readable shards, as last learnt (`_learn_layouts`).
        self._layouts: dict[str, tuple[Shard, ...]] = {}
        self.deployment = deployment
        #: (stream, group, status) -> its `rsc_heartbeat_answers` series (never removed).
        self._answer_series: dict[tuple[str, str, Any], Any] = {}
        self.heartbeat_seconds = Histogram(
            "rsc_heartbeat_seconds",
            "Time to answer heartbeat requests",
            ["endpoint"],
            registry=self.prometheus,
            buckets=HEARTBEAT_BUCKETS,
        )
        self.rebalances = Counter(
            "rsc_rebalances",
            "New target assignments computed",
            ["stream", "group"],
            registry=self.prometheus,
        )
        self.handoffs = Counter(
            "rsc_handoffs",
            "Shards moved from one member to another (revoke acknowledged or timed out, then installed)",
            ["stream", "group"],
            registry=self.prometheus,
        )
        self.handoff_seconds = Histogram(
            "rsc_handoff_seconds",
            "From the revoke request to the install on the new owner",
            ["stream", "group"],
            registry=self.prometheus,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.heartbeat_answers = Counter(
            "rsc_heartbeat_answers",
            "Heartbeat answers decided, by status (SYNC_METADATA: a member reported a layout version"
            " the coordinator does not have); an unchanged answer to a steady member, repeated as it"
            " was, is not counted again",
            ["stream", "group", "status"],
            registry=self.prometheus,
        )
        self.producer_answers = Counter(
            "rsc_producer_answers",
            "Producer heartbeat answers, by status (SYNC_METADATA: a producer reported a layout"
            " version the coordinator does not have)",
            ["stream", "status"],
            registry=self.prometheus,
        )
        self.fenced = Counter(
            "rsc_members_fenced",
            "Members fenced, by reason",
            ["stream", "group", "reason"],
            registry=self.prometheus,
        )
        self._revoked_at: dict[tuple[str, str, int], int] = {}
        self._actors = _ActorCollector(deployment)
        self.prometheus.register(self._actors)
        self.prometheus.register(_DataLossCollector())
        self.prometheus.register(_RetentionCollector(deployment))
        self.prometheus.register(_QuotaCollector())
        self.prometheus.register(_RateCollector())
        self.prometheus.register(_SampleCollector(self))
        deployment.observe_groups(self.observe_group)

    def count_answer(self, body: HeartbeatRequest, answer: HeartbeatResponse) -> None:
        """One heartbeat answer decided (`rsc_heartbeat_answers`)."""
        labels = (body.stream_prefix, body.consumer_group, answer.status)
        child = self._answer_series.get(labels)
        if child is None:  # (`labels()` checks and locks: once per series, not per answer)
            child = self.heartbeat_answers.labels(labels[0], labels[1], answer.status.value)
            self._answer_series[labels] = child
        child.inc()

    def observe_group(
        self, before: GroupState | None, after: GroupState, events: Sequence[GroupEvent]
    ) -> None:
        """Count rebalances, fences and handoffs; time each handoff from its revoke request."""
        labels = (after.stream_prefix, after.group)
        for event in events:
            match event:
                case TargetAssignmentUpdated():
                    self.rebalances.labels(*labels).inc()
                case MemberFenced():
                    self.fenced.labels(*labels, event.reason.value).inc()
                case ShardsRevokeRequested():
                    for shard in event.shards:
                        self._revoked_at[(*labels, shard)] = event.requested_at_ms
                case ShardsInstalled():
                    for shard in event.shards:
                        started = self._revoked_at.pop((*labels, shard), None)
                        if started is not None:
                            self.handoffs.labels(*labels).inc()
                            seconds = max(0, self.deployment.now_ms() - started) / 1000
                            self.handoff_seconds.labels(*labels).observe(seconds)

    def before_render(self) -> None:
        """What a render beside the event loop (`/metrics`, in a worker thread) must not read
        there, read now, on the loop: the deployment's time."""
        self._actors.now_ms = self.deployment.now_ms()

    async def sample_forever(self, every_s: float = SAMPLE_EVERY_S) -> None:
        """Read the shards' Redis figures every `every_s` (a scrape never waits for Redis), or
        less often where a sample takes longer than `SAMPLE_SHARE` of the time: with tens of
        thousands of shards the interval stretches (up to `SAMPLE_STRETCH_MAX` times), so that
        sampling takes no more than that share of the coordinator's one thread from
        heartbeats. A failed sample (Redis not answering) does not stretch it."""
        while True:
            started = trio.current_time()
            try:
                await self.sample()
            except StoreError as exc:
                log.debug("sampling shard figures: %s", exc)
                stretch = every_s  # (a failed sample, Redis waited for: the usual interval)
            else:
                stretch = (trio.current_time() - started) / SAMPLE_SHARE
            took = trio.current_time() - started
            await trio.sleep(max(0.0, min(max(every_s, stretch), SAMPLE_STRETCH_MAX * every_s) - took))

    async def sample(self) -> None:
        """Sample every stream whose layout this process knows: from its running stream actor,
        else a running group actor, else the last layout seen. An actor stopped for being idle
        (no producer, no member left) keeps its series: a group whose workers all died is
        exactly when its lag must go on being reported."""
        self._learn_layouts()
        samples: dict[tuple[str, int], ShardSample] = {}
        layouts = list(self._layouts.items())
        # Every stream's shards in one pass (pipelined in chunks by the effects), not two round
        # trips per stream: 10,000 streams are 20,000 round trips every interval otherwise.
        keys = [s.key for _, shards in layouts for s in shards]
        figures = await self.deployment.shard_figures(keys)
        stats, dead = figures.stats, figures.dead_letters
        for prefix, shards in layouts:
            for shard in shards:
                found = stats.get(shard.key)
                groups = {g.group: (g.pending, g.lag) for g in found.groups} if found else {}
                length = found.length if found else 0
                samples[(prefix, shard.index)] = ShardSample(
                    prefix, shard.index, length, groups, dead.get(shard.key, 0)
                )
        self.samples = samples

    def _learn_layouts(self) -> None:
        """The readable shards of each stream: from its running stream actor, else the newest
        of the layout the deployment last saw this term (the drain watcher looks at every stream
        once a term, and every layout change is recorded) and the running group actors' copies.
        So a stream nobody uses since this process became active is reported too."""
        streams: dict[str, StreamState] = {}
        newest: dict[str, Layout] = dict(self.deployment.layouts_seen())
        for figures in self.deployment.actor_figures():
            state = figures.state if figures.started else None
            if isinstance(state, StreamState):
                streams[state.stream_prefix] = state
            elif isinstance(state, GroupState) and not state.deleted:
                seen = newest.get(state.stream_prefix)
                if seen is None or state.layout.metadata_version > seen.metadata_version:
                    newest[state.stream_prefix] = state.layout
        for prefix, stream in streams.items():
            if stream.deleted:
                newest.pop(prefix, None)
            else:
                newest[prefix] = stream.layout
        self._layouts = {p: tuple(s for s in layout.shards if s.readable) for p, layout in newest.items()}


class _SampleCollector:
    """The last sample of the shards' Redis figures: one series per readable shard (and group)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        length = GaugeMetricFamily(
            "rsc_shard_length", "Entries in the shard key (XLEN)", labels=["stream", "shard"]
        )
        lag = GaugeMetricFamily(
            "rsc_group_lag",
            "Entries of the shard the group has not read yet (XINFO GROUPS lag; absent when unknown)",
            labels=["stream", "group", "shard"],
        )
        pending = GaugeMetricFamily(
            "rsc_group_pending",
            "Entries of the shard read by the group but not acknowledged (XPENDING count)",
            labels=["stream", "group", "shard"],
        )
        dead = GaugeMetricFamily(
            "rsc_dead_letters", "Entries in the shard's dead-letter stream", labels=["stream", "shard"]
        )
        for sample in self.metrics.samples.values():
            shard = str(sample.shard)
            length.add_metric([sample.stream, shard], sample.length)
            dead.add_metric([sample.stream, shard], sample.dead_letters)
            for group, (waiting, behind) in sample.groups.items():
                pending.add_metric([sample.stream, group, shard], waiting)
                if behind is not None:
                    lag.add_metric([sample.stream, group, shard], behind)
        yield from (length, lag, pending, dead)


#: Requests refused for a quota, by quota (`rsc.events.quotas`), in this process.
QUOTA_REFUSALS: collections.Counter[str] = collections.Counter()


def refusal_details(error: CoordinationError) -> dict[str, Any] | None:
    """The `details` of a refusal's JSON error; a quota refusal is counted first
    (`rsc_quota_refusals_total{quota}`). Raises nothing."""
    if isinstance(error, QuotaExceeded):
        QUOTA_REFUSALS[error.quota] += 1
    return error.details


class _QuotaCollector:
    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            "rsc_quota_refusals",
            "Requests refused with QUOTA_EXCEEDED, by quota (streams, shards_per_stream, "
            "groups_per_stream, members_per_group, producers_per_stream)",
            labels=["quota"],
        )
        for name in quotas.NAMES:
            refused.add_metric([name], QUOTA_REFUSALS[name])
        yield refused


class _RateCollector:
    def collect(self) -> Iterator[Metric]:
        limited = CounterMetricFamily(
            "rsc_rate_limited",
            "Requests refused with RATE_LIMITED, by limit (party: one member or producer id; "
            "joins: one member id's joins; heartbeats, views: one caller; admin-writes: one address)",
            labels=["kind"],
        )
        for kind in ratelimit.KINDS:
            limited.add_metric([kind], ratelimit.RATE_LIMITED[kind])
        yield limited


class _RetentionCollector:
    """What retention did in this process (`Registry.retention_figures`)."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def collect(self) -> Iterator[Metric]:
        figures = self.deployment.retention_figures
        lost = CounterMetricFamily(
            "rsc_group_trimmed_unseen",
            "Entries retention removed before the group acknowledged them (never delivered, or "
            "delivered and pending): lost for that group (the group view's trimmedUnseen)",
            labels=["stream", "group"],
        )
        trimmed = CounterMetricFamily(
            "rsc_stream_trimmed", "Entries retention removed from the stream's shard keys", labels=["stream"]
        )
        oldest = GaugeMetricFamily(
            "rsc_group_oldest_unacked_age_seconds",
            "Age of the group's oldest entry not acknowledged yet, over every shard, at the last "
            "retention round (0: none); alert on it before a limit removes anything",
            labels=["stream", "group"],
        )
        for (stream, group), n in sorted(figures.lost.items()):
            lost.add_metric([stream, group], n)
        for stream, n in sorted(figures.trimmed.items()):
            trimmed.add_metric([stream], n)
        for (stream, group), age in sorted(figures.oldest_age_s.items()):
            oldest.add_metric([stream, group], age)
        oom = CounterMetricFamily(
            "rsc_redis_oom_refusals",
            "Writes of this coordinator Redis refused with OOM (used memory above maxmemory)",
        )
        oom.add_metric([], OOM_REFUSALS[0])
        yield from (lost, trimmed, oldest, oom)


class _DataLossCollector:
    """What Redis lost, as this coordinator noticed it (`rsc.actors.dataset.DATA_LOSS`)."""

    def collect(self) -> Iterator[Metric]:
        lost = CounterMetricFamily(
            "rsc_redis_data_loss",
            "Losses of Redis data noticed, by kind: everything (marker gone: a restart without "
            "persistence, FLUSHALL), rollback (an older copy), lease, aggregate (written back from "
            "memory), shard (a shard key, consumer group or owner token reported by a member)",
            labels=["kind"],
        )
        for kind in KINDS:
            lost.add_metric([kind], DATA_LOSS.counts[kind])
        yield lost


class _ActorCollector:
    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        #: The deployment's time, as read on the event loop before a render (`Metrics.before_render`):
        #: a render runs in a worker thread, where a trio clock cannot be read. None: read it now.
        self.now_ms: int | None = None

    def collect(self) -> Iterator[Metric]:
        members = GaugeMetricFamily(
            "rsc_members", "Live members by reconciliation state", labels=["stream", "group", "state"]
        )
        group_epoch = GaugeMetricFamily("rsc_group_epoch", "Group epoch", labels=["stream", "group"])
        assignment_epoch = GaugeMetricFamily(
            "rsc_assignment_epoch", "Assignment epoch (a change is a rebalance)", labels=["stream", "group"]
        )
        revoking = GaugeMetricFamily(
            "rsc_revoking_shards", "Shards waiting for a revoke ack", labels=["stream", "group"]
        )
        paused = GaugeMetricFamily(
            "rsc_group_paused",
            "1 while an operator has paused the group (its members hold no shard, lag grows)",
            labels=["stream", "group"],
        )
        inbox = GaugeMetricFamily(
            "rsc_actor_inbox_depth", "Commands waiting in an actor's inbox", labels=["aggregate"]
        )
        writes = CounterMetricFamily(
            "rsc_journal_writes", "Journal writes by this process", labels=["aggregate"]
        )
        conflicts = CounterMetricFamily(
            "rsc_cas_conflicts", "Concurrency conflicts met", labels=["aggregate"]
        )
        shards = GaugeMetricFamily(
            "rsc_shards",
            "Shards of a stream by state (DRAINING: a scale-in in progress)",
            labels=["stream", "state"],
        )
        phase = GaugeMetricFamily(
            "rsc_migration_phase",
            "1 for the phase the stream's last migration is in (PAUSING, QUIESCED, SWITCHING, "
            "DRAINING, DONE, ABORTED), 0 for the others",
            labels=["stream", "phase"],
        )
        in_phase = GaugeMetricFamily(
            "rsc_migration_phase_seconds",
            "How long the stream's running migration has been in its phase (0 when none runs)",
            labels=["stream"],
        )
        stalled = GaugeMetricFamily(
            "rsc_migration_stalled",
            "1 while the stream's migration is stopped at a phase bound, for an operator to resume or abort",
            labels=["stream"],
        )
        now_ms = self.now_ms if self.now_ms is not None else self.deployment.now_ms()
        for actor in self.deployment.actor_figures():
            name = actor.aggregate
            inbox.add_metric([name], actor.inbox_depth)
            writes.add_metric([name], actor.writes)
            conflicts.add_metric([name], actor.conflicts)
            state = actor.state
            if isinstance(state, GroupState):
                labels = [state.stream_prefix, state.group]
                by_state = collections.Counter(state.member_state(m) for m in state.members.values())
                for member_state in MemberState:
                    members.add_metric([*labels, member_state.value], by_state[member_state])
                group_epoch.add_metric(labels, state.group_epoch)
                assignment_epoch.add_metric(labels, state.assignment_epoch)
                revoking.add_metric(labels, sum(len(m.revoking) for m in state.members.values()))
                paused.add_metric(labels, float(state.paused is not None))
            elif isinstance(state, StreamState) and not state.deleted:
                by_shard_state = collections.Counter(s.state for s in state.layout.shards)
                for shard_state in ShardState:
                    shards.add_metric([state.stream_prefix, shard_state.value], by_shard_state[shard_state])
                m = state.migration
                if m is not None:
                    for each in MigrationPhase:
                        phase.add_metric([state.stream_prefix, each.value], float(m.phase is each))
                    since = m.phases[-1].at_ms
                    seconds = max(0, now_ms - since) / 1000 if m.running else 0.0
                    in_phase.add_metric([state.stream_prefix], seconds)
                    stalled.add_metric([state.stream_prefix], float(m.stalled is not None))
        yield from (members, group_epoch, assignment_epoch, revoking, inbox, writes, conflicts, shards)
        yield from (phase, in_phase, stalled, paused)


#: The label that names a series' stream.
STREAM_LABEL = "stream"


class _Scoped:
    """A collector of what `scope` may see of `source`: series of the streams it covers. Series
    without a stream label aggregate every stream's data (heartbeat latency, refusals, data
    loss) or describe the process: absent, as for a stream it may not see."""

    def __init__(self, source: CollectorRegistry, scope: Scope) -> None:
        self.source = source
        self.scope = scope

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            kept = [
                sample
                for sample in family.samples
                if STREAM_LABEL in sample.labels and self.scope.sees(sample.labels[STREAM_LABEL])
            ]
            if kept:
                copy = Metric(family.name, family.documentation, family.type, family.unit)
                copy.samples = kept
                yield copy


def scoped_registry(source: CollectorRegistry, scope: Scope) -> CollectorRegistry:
    """A registry holding what `scope` may see of `source` (`rsc.events.auth.read_scope`)."""
    scoped = CollectorRegistry(auto_describe=False)
    scoped.register(_Scoped(source, scope))
    return scoped

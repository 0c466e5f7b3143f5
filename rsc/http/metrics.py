"""Prometheus metrics: heartbeat latency, and live figures read from the actors at scrape time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rsc.actors.registry import Registry
from rsc.events.group import GroupState
from rsc.events.model import MemberState


class Metrics:
    """One Prometheus registry per app (so several apps can share a process)."""

    def __init__(self, registry: Registry) -> None:
        self.prometheus = CollectorRegistry()
        self.heartbeat_seconds = Histogram(
            "rsc_heartbeat_seconds",
            "Time to answer heartbeat requests",
            ["endpoint"],
            registry=self.prometheus,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self.prometheus.register(_ActorCollector(registry))


class _ActorCollector:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

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
        inbox = GaugeMetricFamily(
            "rsc_actor_inbox_depth", "Commands waiting in an actor's inbox", labels=["aggregate"]
        )
        writes = CounterMetricFamily(
            "rsc_journal_writes", "Journal writes by this process", labels=["aggregate"]
        )
        conflicts = CounterMetricFamily(
            "rsc_cas_conflicts", "Concurrency conflicts met", labels=["aggregate"]
        )
        for aggregate_id, entry in list(self.registry.actors.items()):
            actor = entry.actor
            name = str(aggregate_id)
            inbox.add_metric([name], actor.inbox_depth)
            writes.add_metric([name], actor.writes)
            conflicts.add_metric([name], actor.conflicts)
            state = actor.state
            if isinstance(state, GroupState):
                labels = [state.stream_prefix, state.group]
                by_state = Counter(state.member_state(m) for m in state.members.values())
                for member_state in MemberState:
                    members.add_metric([*labels, member_state.value], by_state[member_state])
                group_epoch.add_metric(labels, state.group_epoch)
                assignment_epoch.add_metric(labels, state.assignment_epoch)
                revoking.add_metric(labels, sum(len(m.revoking) for m in state.members.values()))
        yield from (members, group_epoch, assignment_epoch, revoking, inbox, writes, conflicts)

"""A worker's own Prometheus metrics (`rsc worker --metrics-port`): what its members handled,
how long handlers took, what failed and was dead-lettered, which shards each member owns."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rsc.client.member import Member
from rsc.client.poller import Poller


class Workers(Protocol):
    """What the metrics read from a worker's `App`: its members and their pollers, pairwise."""

    @property
    def members(self) -> Sequence[Member]: ...

    @property
    def pollers(self) -> Sequence[Poller]: ...


class WorkerMetrics:
    """One registry per App; counters are read from the pollers at scrape time."""

    def __init__(self, app: Workers) -> None:
        self.prometheus = CollectorRegistry()
        self.prometheus.register(PROCESS_COLLECTOR)
        self.prometheus.register(PLATFORM_COLLECTOR)
        self.handler_seconds = Histogram(
            "rsc_worker_handler_seconds",
            "Time a handler took, failed calls included",
            ["stream", "group"],
            registry=self.prometheus,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.prometheus.register(_PollerCollector(app))


class _PollerCollector:
    def __init__(self, app: Workers) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        labels = ["stream", "group", "member"]
        handled = CounterMetricFamily("rsc_worker_handled", "Entries handled and acknowledged", labels=labels)
        failed = CounterMetricFamily(
            "rsc_worker_failed", "Handler calls that raised (retried later)", labels=labels
        )
        retried = CounterMetricFamily(
            "rsc_worker_retried",
            "Handler calls for entries delivered before (after a failure or a crash)",
            labels=labels,
        )
        dead = CounterMetricFamily(
            "rsc_worker_dead_lettered", "Entries moved to the dead-letter stream", labels=labels
        )
        stalls = CounterMetricFamily(
            "rsc_worker_stalls",
            "Shards found with entries waiting and no read for stall_after_s (read again, reported)",
            labels=labels,
        )
        owned = GaugeMetricFamily("rsc_worker_owned_shards", "Shards the member reads now", labels=labels)
        per_shard = [*labels, "shard"]
        lag = GaugeMetricFamily(
            "rsc_worker_shard_lag",
            "Entries not yet delivered to the member's group, per shard it owns"
            " (XINFO GROUPS, every reclaim_every_s)",
            labels=per_shard,
        )
        pending = GaugeMetricFamily(
            "rsc_worker_shard_pending",
            "Entries read and not yet acknowledged, per shard it owns",
            labels=per_shard,
        )
        for member, poller in zip(self.app.members, self.app.pollers, strict=False):
            values = [member.machine.stream_prefix, member.machine.group, member.member_id]
            handled.add_metric(values, poller.handled)
            failed.add_metric(values, poller.failed)
            retried.add_metric(values, poller.retried)
            dead.add_metric(values, poller.dead_lettered)
            stalls.add_metric(values, poller.stalls)
            owned.add_metric(values, len(member.owned))
            for shard, (waiting, behind) in sorted(poller.lag.items()):
                if shard not in member.owned:
                    continue  # measured before it moved away
                pending.add_metric([*values, str(shard)], waiting)
                if behind is not None:
                    lag.add_metric([*values, str(shard)], behind)
        yield from (handled, failed, retried, dead, stalls, owned, lag, pending)

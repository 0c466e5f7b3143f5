"""Reading Redis for the coordinator: shard statistics and lag, drain evidence, topology, ping.

Nothing here writes. Drain evidence is read in one script on the shard key's own node
(`coordinator/drain_evidence`); whether it shows the shard drained is the pure rule of
`rsc.events.drain`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import coredis

from rsc.actors.effects.pipelines import CoordinatorScript, RedisEffectsBase, chunks
from rsc.actors.errors import CommandRefused, StoreUnavailable
from rsc.actors.store_connection import ScriptCall, redis_errors
from rsc.events.drain import DrainEvidence, GroupDrain, evidence
from rsc.events.slots import Primary, Topology
from rsc.events.wire import seal_key
from rsc.redis_errors import error_code, is_unavailable


@attrs.frozen
class GroupLag:
    """One consumer group on one shard key, as XINFO GROUPS reports it (`consumers`: the
    consumer names it holds; departed members' are pruned once nothing is pending under them)."""

    group: str
    pending: int
    lag: int | None
    last_delivered_id: str
    consumers: int = 0


@attrs.frozen
class ShardStats:
    """What Redis says about one shard key (for monitoring; `lag` may be null or stale)."""

    length: int
    groups: tuple[GroupLag, ...]
    primary_node: str | None = None


class Inspection(Protocol):
    """What Redis says about the data plane. Every call raises `StoreUnavailable` when Redis
    does not answer (except `ping`, which says so), and coredis' `ResponseError` when Redis
    refuses a command (a shard key of another type)."""

    async def ping(self) -> bool:
        """Whether the data plane answers. Raises nothing."""
        ...

    async def topology(self) -> Topology | None:
        """The Redis Cluster primaries and their slots; None on standalone Redis."""
        ...

    async def shard_stats(self, shard_keys: Iterable[str]) -> dict[str, ShardStats]:
        """Length, consumer groups and primary node of each shard key (a missing key: empty)."""
        ...

    async def drain_evidence(self, shard_keys: Iterable[str]) -> dict[str, DrainEvidence]:
        """Each key's drain evidence (`coordinator/drain_evidence`), read on its own node."""
        ...


class RedisInspection(RedisEffectsBase):
    """`Inspection` on Redis: pipelined per node, `CHUNK` keys per round trip."""

    _drain_evidence = CoordinatorScript("drain_evidence")

    async def ping(self) -> bool:
        """See `Inspection.ping`."""
        try:
            with redis_errors("ping"):
                await self.redis.ping()
        except StoreUnavailable:
            return False
        return True

    async def topology(self) -> Topology | None:
        """The cluster's primaries and the namespace of new shard keys (None: standalone Redis
        and no namespace). Raises `StoreUnavailable` when Redis does not answer."""
        namespace = self.keys.namespace
        if not isinstance(self.redis, coredis.RedisCluster):
            return Topology((), namespace) if namespace else None
        with redis_errors("reading the cluster layout"):
            try:
                found = topology_from_shards(await self.redis.cluster_shards())
            except coredis.exceptions.ResponseError:  # before Redis 7: no CLUSTER SHARDS
                found = topology_from_slots(await self.redis.cluster_slots())
        return attrs.evolve(found, namespace=namespace)

    async def shard_stats(self, shard_keys: Iterable[str]) -> dict[str, ShardStats]:
        """See `Inspection.shard_stats` (a refusal other than a missing key's: `StoreUnavailable`)."""
        keys = list(shard_keys)
        topology = await self.topology()
        stats: dict[str, ShardStats] = {}
        for chunk in chunks(keys):  # XLEN and XINFO GROUPS of `CHUNK` keys per round trip and node
            with redis_errors("reading shard statistics"):
                async with self.redis.pipeline(transaction=False, raise_on_error=False) as pipe:
                    for key in chunk:
                        pipe.xlen(key)
                        pipe.xinfo_groups(key)
            results = pipe.results or ()
            for key, xlen, xinfo in zip(chunk, results[::2], results[1::2], strict=True):
                length, infos = xlen, xinfo
                if isinstance(xlen, BaseException) or isinstance(xinfo, BaseException):
                    _raise_unless_missing(key, xlen, xinfo)
                    length, infos = 0, ()  # the key does not exist (yet)
                groups = tuple(
                    GroupLag(
                        str(i["name"]),
                        int(i["pending"]),
                        i.get("lag"),
                        str(i["last-delivered-id"]),
                        int(i.get("consumers", 0)),
                    )
                    for i in infos
                )
                node = (
                    None
                    if topology is None or not topology.primaries
                    else (topology.node_of(key) or "unknown")
                )
                stats[key] = ShardStats(int(length), groups, node)
        return stats

    async def drain_evidence(self, shard_keys: Iterable[str]) -> dict[str, DrainEvidence]:
        """See `Inspection.drain_evidence`."""
        out: dict[str, DrainEvidence] = {}
        for chunk in chunks(shard_keys):
            calls: list[ScriptCall] = [(self._drain_evidence, [key, seal_key(key)], []) for key in chunk]
            read = await self._scripts(calls, unfenced="reading drain evidence")
            for key, (sealed, last, groups) in zip(chunk, read, strict=True):
                found = (GroupDrain(str(g[0]), int(g[1]), bool(int(g[2]))) for g in groups)
                out[key] = evidence(bool(int(sealed)), str(last or ""), found)
        return out


def _raise_unless_missing(key: str, xlen: object, xinfo: object) -> None:
    """Raise the error of `XLEN` or `XINFO GROUPS` of one key, unless the key does not exist:
    then `XLEN` answers 0 and `XINFO` refuses with the generic `ERR` code (Redis gives a missing
    key no code of its own; any other refusal has one, e.g. `WRONGTYPE`, and is raised). The
    refusal is classified by its code alone, never by the rest of its text: `CommandRefused`
    (`WRONGTYPE`: something else wrote the key), or `StoreUnavailable` for a Redis that may
    answer later."""
    missing = xlen == 0 and isinstance(xinfo, coredis.exceptions.ResponseError) and error_code(xinfo) == "ERR"
    for failure in (xlen, xinfo):
        if not isinstance(failure, BaseException) or (failure is xinfo and missing):
            continue
        code = error_code(failure)
        if code is not None and not is_unavailable(failure):
            raise CommandRefused(f"reading shard statistics of {key}: {failure}", code, key) from failure
        raise StoreUnavailable(f"reading shard statistics: {failure}") from failure


def topology_from_shards(shards: Iterable[Mapping[str, Any]]) -> Topology:
    """The primaries from a CLUSTER SHARDS reply (Redis 7+)."""
    primaries = []
    for shard in shards:
        primary = next((n for n in shard["nodes"] if n["role"] == "master"), None)
        bounds = shard["slots"]
        if primary is None or not bounds:
            continue
        ranges = tuple((int(low), int(high)) for low, high in zip(bounds[::2], bounds[1::2], strict=True))
        primaries.append(Primary(f"{primary['ip']}:{primary['port']}", ranges))
    return Topology(tuple(sorted(primaries, key=lambda p: p.first_slot)))


def topology_from_slots(slots: Mapping[tuple[int, int], Sequence[Mapping[str, Any]]]) -> Topology:
    """The primaries from a CLUSTER SLOTS reply (any version; a range's first node is its primary)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for (low, high), nodes in slots.items():
        if nodes:
            ranges.setdefault(f"{nodes[0]['host']}:{nodes[0]['port']}", []).append((int(low), int(high)))
    primaries = (Primary(node, tuple(sorted(r))) for node, r in ranges.items())
    return Topology(tuple(sorted(primaries, key=lambda p: p.first_slot)))

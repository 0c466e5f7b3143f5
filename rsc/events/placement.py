"""Where shard keys land: shard key names spread over the cluster's primaries.

Redis Cluster puts a key in slot `CRC16(tag) mod 16384`, where `tag` is the
part between the first `{` and the next `}` when that part is not empty
(else the whole key). A shard key is `<prefix>:{<tag>}`, so the shard's own
keys (owner tokens, dead letters) share its slot.

The coordinator names new shards so that the stream's ACTIVE shards spread
evenly over the primaries: each new shard's tag is the first of
`<prefix>:<index>`, `<prefix>:<index>:1`, `<prefix>:<index>:2`, ... whose
slot is served by one of the primaries holding the fewest of them. (Any of
the emptiest primaries will do, so few candidates are tried: about ln P
on average for P primaries.) The topology is an input (read from Redis
by the caller, like the time; hash slots and the topology are
`rsc.events.slots`); without one (standalone Redis) the tag is
`<prefix>:<index>`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rsc.events.slots import SLOTS, Topology, key_slot

#: Far more than ever needed: a primary serving 1/P of the slots is hit after P tries on average.
MAX_TAG_TRIES = 1_000_000


def shard_key(stream_prefix: str, index: int, attempt: int = 0, namespace: str = "") -> str:
    """The Redis key of shard `index` (the `attempt`-th candidate name), after `namespace`
    (which is not in the hash tag: a shard's slot does not depend on it)."""
    tag = f"{stream_prefix}:{index}" if attempt == 0 else f"{stream_prefix}:{index}:{attempt}"
    return f"{namespace}{stream_prefix}:{{{tag}}}"


def place(
    stream_prefix: str, indexes: Sequence[int], active_keys: Iterable[str], topology: Topology | None
) -> list[str]:
    """Names for new shards `indexes`, each on a primary holding the fewest ACTIVE shards so far."""
    if topology is None or not topology.primaries:
        namespace = "" if topology is None else topology.namespace
        return [shard_key(stream_prefix, index, namespace=namespace) for index in indexes]
    namespace = topology.namespace
    owner: list[str | None] = [None] * SLOTS
    for primary in topology.primaries:
        for low, high in primary.ranges:
            owner[low : high + 1] = [primary.node] * (high - low + 1)
    counts = topology.count(active_keys)
    names = []
    for index in indexes:
        fewest = min(counts.values())
        for attempt in range(MAX_TAG_TRIES):
            key = shard_key(stream_prefix, index, attempt, namespace)
            node = owner[key_slot(key)]
            if node is not None and counts[node] == fewest:
                break
        else:  # pragma: no cover - a cluster whose emptiest primaries serve almost no slot
            key = shard_key(stream_prefix, index, namespace=namespace)
            node = owner[key_slot(key)]
        names.append(key)
        if node is not None:
            counts[node] += 1
    return names

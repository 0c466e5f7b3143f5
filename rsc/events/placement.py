"""Where shard keys land: hash slots, the cluster's primaries, and shard key names.

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
by the caller, like the time); without one (standalone Redis) the tag is
`<prefix>:<index>`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

SLOTS = 16_384
#: Far more than ever needed: a primary serving 1/P of the slots is hit after P tries on average.
MAX_TAG_TRIES = 1_000_000


def _crc16_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return tuple(table)


_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster uses."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc


def key_slot(key: str | bytes) -> int:
    """The hash slot of `key`, honouring hash tags exactly as Redis Cluster does."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return crc16(data) % SLOTS


@attrs.frozen
class Primary:
    """One primary node ("host:port") and the slot ranges (inclusive) it serves."""

    node: str
    ranges: tuple[tuple[int, int], ...]

    def serves(self, slot: int) -> bool:
        return any(low <= slot <= high for low, high in self.ranges)

    @property
    def first_slot(self) -> int:
        return min((low for low, _ in self.ranges), default=SLOTS)


@attrs.frozen
class Topology:
    """The primaries of a Redis Cluster, as the coordinator last read them."""

    primaries: tuple[Primary, ...]

    def node_of(self, key: str) -> str | None:
        """The primary serving `key`, or None if no primary serves its slot (a resharding gap)."""
        slot = key_slot(key)
        return next((p.node for p in self.primaries if p.serves(slot)), None)

    def count(self, keys: Iterable[str]) -> dict[str, int]:
        """Primary -> how many of `keys` it serves (every primary listed, zeros included)."""
        counts = dict.fromkeys(sorted(p.node for p in self.primaries), 0)
        for key in keys:
            node = self.node_of(key)
            if node is not None:
                counts[node] += 1
        return counts


def shard_key(stream_prefix: str, index: int, attempt: int = 0) -> str:
    """The Redis key of shard `index` (the `attempt`-th candidate name)."""
    tag = f"{stream_prefix}:{index}" if attempt == 0 else f"{stream_prefix}:{index}:{attempt}"
    return f"{stream_prefix}:{{{tag}}}"


def place(
    stream_prefix: str, indexes: Sequence[int], active_keys: Iterable[str], topology: Topology | None
) -> list[str]:
    """Names for new shards `indexes`, each on a primary holding the fewest ACTIVE shards so far."""
    if topology is None or not topology.primaries:
        return [shard_key(stream_prefix, index) for index in indexes]
    owner: list[str | None] = [None] * SLOTS
    for primary in topology.primaries:
        for low, high in primary.ranges:
            owner[low : high + 1] = [primary.node] * (high - low + 1)
    counts = topology.count(active_keys)
    names = []
    for index in indexes:
        fewest = min(counts.values())
        for attempt in range(MAX_TAG_TRIES):
            key = shard_key(stream_prefix, index, attempt)
            node = owner[key_slot(key)]
            if node is not None and counts[node] == fewest:
                break
        else:  # pragma: no cover - a cluster whose emptiest primaries serve almost no slot
            key, node = shard_key(stream_prefix, index), owner[key_slot(shard_key(stream_prefix, index))]
        names.append(key)
        if node is not None:
            counts[node] += 1
    return names

"""Redis Cluster hash slots and the primaries that serve them: plain values.

`key_slot` is the slot Redis Cluster puts a key in; a `Topology` (read from
Redis by the caller, like the time) says which primary serves which slots.
Commands carry a topology, so this module stays small and free of the
placement rules (`rsc.events.placement`), which only the stream aggregate
needs.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

SLOTS = 16_384


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
    """Where new shard keys go: the primaries of a Redis Cluster as the coordinator last read
    them (none on standalone Redis), and the namespace every key starts with ("" or e.g.
    "demo:", see `rsc.actors.keys.KeySpace`)."""

    primaries: tuple[Primary, ...]
    namespace: str = ""

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

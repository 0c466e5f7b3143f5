"""Routing protocol `jump-v1`: (active shard count, partition key bytes) -> shard.

Defined so that any language can implement it from docs/routing.md:

1. `h` = the first 8 bytes of SHA-256(key), read as an unsigned big-endian
   64-bit integer.
2. `bucket` = jump consistent hash (Lamping and Veach, 2014) of `h` over `n`
   buckets, with IEEE-754 double arithmetic exactly as below.
3. The shard is the `bucket`-th ACTIVE shard of the layout in ascending index
   order.

Scale-out appends shards after the highest index, so going from `n` to `n+1`
active shards moves a key only to the new shard, and moves about 1/(n+1) of
all keys (`hash mod n` would move almost all of them).
"""

from __future__ import annotations

import hashlib

from rsc.events.model import Layout, Shard

JUMP_V1 = "jump-v1"
_MASK = (1 << 64) - 1
_MULTIPLIER = 2862933555777941757


def key_hash(key: bytes) -> int:
    """The 64-bit hash routing uses: SHA-256, first 8 bytes, big-endian."""
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def jump(h: int, buckets: int) -> int:
    """Jump consistent hash of the 64-bit `h` over `buckets` (>= 1) buckets."""
    if buckets < 1:
        raise ValueError("at least one bucket is needed")
    b, j = -1, 0
    while j < buckets:
        b = j
        h = (h * _MULTIPLIER + 1) & _MASK
        j = int((b + 1) * (float(1 << 31) / float((h >> 33) + 1)))
    return b


def bucket_of(key: bytes, active: int) -> int:
    """The position, among `active` ACTIVE shards, that `key` routes to."""
    return jump(key_hash(key), active)


def route(layout: Layout, key: bytes) -> Shard:
    """The shard of `layout` that `key` routes to (`jump-v1`); ValueError without ACTIVE shards."""
    return Router(layout).shard(key)


class Router:
    """`route` for many keys under one layout: the ACTIVE shards are picked out once."""

    __slots__ = ("active", "layout")

    def __init__(self, layout: Layout) -> None:
        if layout.routing != JUMP_V1:
            raise ValueError(f"routing protocol {layout.routing!r} is not {JUMP_V1!r}")
        self.layout = layout
        self.active = layout.active

    def shard(self, key: bytes) -> Shard:
        """The ACTIVE shard `key` routes to; ValueError if there is none."""
        if not self.active:
            raise ValueError("the layout has no ACTIVE shard to route to")
        return self.active[jump(key_hash(key), len(self.active))]

"""Shard keys and their consumer groups: created, sealed, expired, deleted, found again.

Each call is idempotent (run again on recovery): a shard key is created empty and an existing
one never touched (`coordinator/ensure_stream`), a consumer group is created unless it exists
and never moved (`coordinator/ensure_group`), the first seal stays. A shard key is deleted or
expired with everything kept next to it (owner tokens, seal, dead letters).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

import attrs
from coredis.tokens import PureToken

from rsc.actors.effects.pipelines import CoordinatorScript, RedisEffectsBase, chunks
from rsc.actors.keys import owner_key
from rsc.actors.store_connection import ScriptCall, redis_errors
from rsc.events.wire import cap_key, dead_letter_key, seal_key, trimmed_key


class ShardKeys(Protocol):
    """The shard keys of streams and the consumer groups on them.

    Every write raises `TermFenced` outside an active term; every call raises
    `StoreUnavailable` when Redis does not answer (and coredis' `ResponseError` when Redis
    refuses a command, as on a key of another type)."""

    async def ensure_streams(self, shard_keys: Iterable[str]) -> None:
        """Create each shard key (an empty stream) that does not exist."""
        ...

    async def seal(self, shard_keys: Iterable[str], version: int) -> None:
        """Seal the shard keys: producers' appends to them are refused from now on."""
        ...

    async def expire_streams(self, shard_keys: Iterable[str], after_ms: int) -> None:
        """Have Redis delete retired shard keys (with their owner tokens and seal) `after_ms`
        from now; a key that has a time to live already keeps it."""
        ...

    async def delete_streams(self, shard_keys: Iterable[str]) -> None:
        """Delete shard keys with everything kept next to them (owner tokens, seal, dead letters)."""
        ...

    async def find_shard_keys(self, stream_prefix: str) -> dict[int, str]:
        """The shard keys of `stream_prefix` Redis holds (index -> key), found by their names
        (`SCAN`, on every primary): what is left of a stream whose aggregate Redis lost. Writes
        nothing."""
        ...

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None:
        """Create `group`'s consumer group at `start_id` on each key where it does not exist."""
        ...

    async def destroy_consumer_groups(self, shard_keys: Iterable[str], group: str) -> None:
        """Destroy `group`'s consumer group (and its pending entries) and owner token on each key."""
        ...

    async def prune_consumers(self, shard_keys: Iterable[str], group: str, live: Iterable[str]) -> int:
        """Delete `group`'s consumers on `shard_keys` that are not `live` members and have nothing
        pending (`coordinator/prune_consumers`); how many were deleted. Not fenced: it removes
        only what no live member uses."""
        ...


@attrs.frozen
class ShardKeyPattern:
    """Shard key names of one stream (`rsc.events.placement.shard_key`):
    `<namespace><prefix>:{<prefix>:<index>[:<attempt>]}`."""

    glob: str
    regex: re.Pattern[str]

    def index_of(self, key: str) -> int | None:
        """The shard index `key` names, or None when it is not one of this stream's keys."""
        found = self.regex.fullmatch(key)
        return int(found.group(1)) if found else None


def shard_key_pattern(stream_prefix: str, namespace: str) -> ShardKeyPattern:
    """The names of `stream_prefix`'s shard keys under `namespace`, as a SCAN glob and a regex."""
    escaped = re.sub(r"([*?\[\]\\])", r"\\\1", f"{namespace}{stream_prefix}:{{{stream_prefix}:")
    regex = re.compile(re.escape(f"{namespace}{stream_prefix}:{{{stream_prefix}:") + r"(\d+)(?::\d+)?\}")
    return ShardKeyPattern(escaped + "*}", regex)


def shard_companions(key: str) -> tuple[str, ...]:
    """A shard key and every key rsc keeps beside it (same slot): owner tokens, seal, dead
    letters, retention's cap and counts. They go together (deleted, or expired once retired)."""
    return (key, owner_key(key), seal_key(key), dead_letter_key(key), cap_key(key), trimmed_key(key))


class RedisShardKeys(RedisEffectsBase):
    """`ShardKeys` on Redis: one script or command per key, pipelined in chunks per node."""

    _ensure_stream = CoordinatorScript("ensure_stream")
    _ensure_group = CoordinatorScript("ensure_group")
    _destroy_group = CoordinatorScript("destroy_group")
    _prune = CoordinatorScript("prune_consumers")
    _idle = CoordinatorScript("idle_consumers")

    async def ensure_streams(self, shard_keys: Iterable[str]) -> None:
        """See `ShardKeys.ensure_streams`."""
        for chunk in chunks(shard_keys):
            await self._scripts([(self._ensure_stream, [key], []) for key in chunk])

    async def seal(self, shard_keys: Iterable[str], version: int) -> None:
        """See `ShardKeys.seal`."""
        for chunk in chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    pipe.set(seal_key(key), str(version), condition=PureToken.NX)  # the first stays

    async def expire_streams(self, shard_keys: Iterable[str], after_ms: int) -> None:
        """See `ShardKeys.expire_streams` (`after_ms` <= 0: deleted now)."""
        if after_ms <= 0:
            await self.delete_streams(shard_keys)
            return
        for chunk in chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    for each in shard_companions(key):
                        pipe.pexpire(each, after_ms, condition=PureToken.NX)

    async def delete_streams(self, shard_keys: Iterable[str]) -> None:
        """See `ShardKeys.delete_streams`."""
        for chunk in chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    pipe.delete(list(shard_companions(key)))

    async def find_shard_keys(self, stream_prefix: str) -> dict[int, str]:
        """See `ShardKeys.find_shard_keys`."""
        pattern = shard_key_pattern(stream_prefix, self.keys.namespace)
        found: dict[int, str] = {}
        with redis_errors("looking for shard keys"):
            async for key in self.redis.scan_iter(match=pattern.glob, count=1_000, type_="stream"):
                index = pattern.index_of(str(key))
                if index is not None:
                    found.setdefault(index, str(key))
        return found

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None:
        """See `ShardKeys.ensure_consumer_groups`."""
        for chunk in chunks(shard_keys):
            await self._scripts([(self._ensure_group, [key], [group, start_id]) for key in chunk])

    async def destroy_consumer_groups(self, shard_keys: Iterable[str], group: str) -> None:
        """See `ShardKeys.destroy_consumer_groups`."""
        for chunk in chunks(shard_keys):
            await self._scripts([(self._destroy_group, [key, owner_key(key)], [group]) for key in chunk])

    async def prune_consumers(self, shard_keys: Iterable[str], group: str, live: Iterable[str]) -> int:
        """See `ShardKeys.prune_consumers`."""
        # Two passes, so that the cost is the consumers there are, not shards x live members:
        # each shard's idle consumers, then a delete of the departed ones where there are any.
        keep = set(live)
        departed: dict[str, list[str]] = {}
        for chunk in chunks(shard_keys):
            listed = [(self._idle, [key], [group]) for key in chunk]
            idle = await self._scripts(listed, unfenced="listing idle consumers")
            for key, names in zip(chunk, idle, strict=True):
                if gone := sorted({str(n) for n in names} - keep):
                    departed[key] = gone
        pruned = 0
        for chunk in chunks(departed):
            prunes: list[ScriptCall] = [(self._prune, [key], [group, *departed[key]]) for key in chunk]
            done = await self._scripts(prunes, unfenced="pruning departed consumers")
            pruned += sum(int(n) for n in done)
        return pruned

"""Quotas where the registry creates streams and groups: checked, and never exceeded.

A stream created for a caller with a quota (`rsc.events.quotas.Quota`) counts against its
`streams` quota and the deployment's, and its shard count against `shards_per_stream`; a group
against `groups_per_stream`. Stream creations that count are one at a time (`counting`), so a
check and the creation it admits are not interleaved with another's.

Imports `rsc.events` and the effects port (the counts are in Redis).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

from rsc.actors.effects.port import Effects
from rsc.events import quotas
from rsc.events.errors import QuotaExceeded
from rsc.events.quotas import Quota
from rsc.events.stream import StreamState


class QuotaGate:
    """Admits (or refuses with `QuotaExceeded`) what a caller's quota allows it to create."""

    def __init__(self, effects: Effects) -> None:
        self.effects = effects
        #: Stream creations that count against quotas (`counting`).
        self._creating_stream = trio.Lock()

    @contextlib.asynccontextmanager
    async def counting(self, quota: Quota | None) -> AsyncIterator[None]:
        """Stream creations that count against quotas, one at a time: a check and the creation
        it admits are not interleaved with another's, so no quota is ever exceeded. Raises
        nothing of its own."""
        if quota is None:
            yield
            return
        async with self._creating_stream:
            yield

    async def admit_stream(self, quota: Quota, stream_prefix: str, count: int) -> None:
        """Refuse a stream (of `count` shards) that `quota`'s caller may not create.

        Raises `QuotaExceeded`, `StoreError` (counting the streams in Redis)."""
        limits = quota.limits
        if count > limits.shards_per_stream:
            raise QuotaExceeded(
                f"stream {stream_prefix!r} would have {count} shards; the quota "
                f"{quotas.SHARDS_PER_STREAM} allows {limits.shards_per_stream}",
                quotas.SHARDS_PER_STREAM,
                limits.shards_per_stream,
            )
        if await self.effects.stream_count() >= quota.total_streams:
            raise QuotaExceeded(
                f"the deployment has {quota.total_streams} streams, as many as its quota "
                f"{quotas.STREAMS} allows; delete one or raise quota_streams",
                quotas.STREAMS,
                quota.total_streams,
            )
        if await self.effects.created_count(quota.owner) >= limits.streams:
            raise QuotaExceeded(
                f"{quota.owner!r} created {limits.streams} stream(s) that still exist, as many as "
                f"its quota {quotas.STREAMS} allows; delete one, or give it a higher quota",
                quotas.STREAMS,
                limits.streams,
            )

    async def created(self, quota: Quota, stream_prefix: str) -> None:
        """Count the stream created for `quota`'s caller against it. Raises `StoreError`."""
        await self.effects.record_created(quota.owner, stream_prefix)

    @staticmethod
    def admit_group(quota: Quota | None, stream_prefix: str, stream: StreamState | None) -> None:
        """Refuse another group of `stream` if `quota` allows no more. Raises `QuotaExceeded`."""
        if quota is not None and stream is not None:
            limit = quota.limits.groups_per_stream
            if len(stream.groups) >= limit:
                raise QuotaExceeded(
                    f"stream {stream_prefix!r} has {limit} groups, as many as the quota "
                    f"{quotas.GROUPS_PER_STREAM} allows",
                    quotas.GROUPS_PER_STREAM,
                    limit,
                )

"""Quotas where the registry creates streams and groups: checked, and never exceeded.

A stream created for a caller with a quota (`rsc.events.quotas.Quota`) counts against its
`streams` quota and the deployment's, and its shard count against `shards_per_stream`; a group
against `groups_per_stream`. Stream creations that count run side by side (`admitted`): each
check counts the streams Redis records and the creations admitted but not recorded yet, so
creations under way never pass a quota together; checks are one at a time (a lock held for one
Redis read, never across a creation), and two creations of one stream are one after the other.

Imports `rsc.events` and the effects port (the counts are in Redis).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

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
        #: Checks one at a time (each held for one Redis read): two must not pass on one count.
        self._checking = trio.Lock()
        #: Creations admitted and not finished (stream, owner), one entry per admission.
        self._admitted: list[tuple[str, str]] = []
        #: The stream each admitted creation creates, set once it finished (one at a time each).
        self._creating: dict[str, trio.Event] = {}

    @contextlib.asynccontextmanager
    async def admitted(
        self, quota: Quota | None, stream_prefix: str, count: int, missing: Callable[[], bool]
    ) -> AsyncIterator[None]:
        """The block creates `stream_prefix` (`count` shards) for `quota`'s caller, if the quota
        allows it. `missing` says whether the stream is missing (so that creating it counts);
        it is asked once no other creation of the same stream is under way (a second one waits
        for the first: it finds the stream, and counts nothing, or checks afresh if the first
        failed).

        Until the block ends, the creation counts for every other check as a stream of the
        caller and of the deployment, unless Redis already records it (each check reads the
        counts and which admitted streams are recorded in one round trip), so creations run
        side by side without passing a quota together. The block records what it created
        (`created`) before it ends. Raises `QuotaExceeded` (the block does not run),
        `StoreError` (counting in Redis)."""
        if quota is None:
            yield
            return
        entry = (stream_prefix, quota.owner)
        done: trio.Event | None = None
        while done is None:
            async with self._checking:
                first = self._creating.get(stream_prefix)
                if first is None:
                    if not missing():
                        break  # it exists: nothing to count
                    await self._admit_stream(quota, stream_prefix, count)
                    done = self._creating[stream_prefix] = trio.Event()
                    self._admitted.append(entry)
            if first is not None:
                await first.wait()
        if done is None:
            yield
            return
        try:
            yield
        finally:
            self._admitted.remove(entry)
            del self._creating[stream_prefix]
            done.set()

    async def _admit_stream(self, quota: Quota, stream_prefix: str, count: int) -> None:
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
        total, created = await self.effects.stream_counts(quota.owner, self._admitted)
        if total >= quota.total_streams:
            raise QuotaExceeded(
                f"the deployment has {quota.total_streams} streams, as many as its quota "
                f"{quotas.STREAMS} allows; delete one or raise quota_streams",
                quotas.STREAMS,
                quota.total_streams,
            )
        if created >= limits.streams:
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

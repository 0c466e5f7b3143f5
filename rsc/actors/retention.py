"""Retention on a schedule: each stream's shard keys trimmed by its policy, losses counted.

Every `retention_check_s`, each stream with a stored policy (`StreamState.retention`, feature
level 5) has every readable shard key (ACTIVE and DRAINING) trimmed by `Effects.trim`
(`coordinator/trim.lua`: fenced, atomic, each group's loss counted in Redis as the entries go).
The work is paced: at most `shards_per_s` trim calls a second over the whole deployment, so
100,000 shards are each visited every 50 s at the default 2,000/s, and a stream's round is
never faster than `every_s`.

Which groups hold the watermark: every consumer group on the key, except those with no member
for the policy's `inactiveGroupMs` (noticed here: a group whose actor is not running, or runs
with no member, is idle from the first round that sees it so; a restarted coordinator starts
counting again, so a group is never released early). A deleted group's consumer group is
destroyed with it, so it stops holding at once.

Early trims: a producer whose append a full shard refused (`whenFull: refuse`) says so in its
next heartbeat (`fullShards`, sent at once), and a stream whose policy changes asks for all of
its shards (a new cap is written at once); `TrimRequests` collects them and the schedule trims
them before its next round, at most once every `REQUEST_GAP_S` (the same pace,
the same rules: a request can only bring a trim the schedule would do anyway forward).

What a trim lost for a group is journaled (`RetentionLoss`, through the stream's actor), logged
as a warning, and added to `RetentionFigures` (`/metrics`: `rsc_group_trimmed_unseen_total`,
`rsc_stream_trimmed_total`, `rsc_group_oldest_unacked_age_seconds`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import attrs
import trio

from rsc.actors import drain_watch
from rsc.actors.effects.trimming import TRIMMED_TOTAL_FIELD, TrimCall, Trimmed
from rsc.actors.errors import ROUND_FAILURES, TermFenced, log_round_failure
from rsc.actors.keys import AggregateId
from rsc.events.commands import RecordRetentionLoss
from rsc.events.model import Shard
from rsc.events.retention import Retention
from rsc.events.stream import StreamState

log = logging.getLogger("rsc.retention")

#: Trim calls sent together (one round trip per node).
BATCH = 256
#: The least time between two passes over the shards producers reported full (bounds what a
#: stream of reports, genuine or not, can cost).
REQUEST_GAP_S = 0.25
#: How many times one round calls a shard again that has more to remove (each call removes at
#: most `TRIM_LIMIT` one by one); the rest waits for the next round.
MORE_ROUNDS = 8


@attrs.define
class RetentionFigures:
    """What retention did, as `/metrics` shows it: per (stream, group) the entries it lost,
    per stream the entries removed, and per (stream, group) the age of its oldest entry not
    acknowledged (seconds, at the last trim). Loss totals start from the counts in Redis the
    first time a stream is trimmed in this process, so they agree with the group view."""

    lost: dict[tuple[str, str], int] = attrs.field(factory=dict)
    trimmed: dict[str, int] = attrs.field(factory=dict)
    oldest_age_s: dict[tuple[str, str], float] = attrs.field(factory=dict)
    loaded: set[str] = attrs.field(factory=set)


class TrimRequests:
    """Shards to trim before the next round, per stream (see the module): those producers
    reported full, or every shard of a stream whose policy just changed."""

    def __init__(self) -> None:
        #: stream prefix -> the shard indexes asked for (None: all of them).
        self.pending: dict[str, set[int] | None] = {}
        self._arrived = trio.Event()
        #: Whether a schedule takes them (`watch_retention` running with an interval): else a
        #: request is dropped, never kept.
        self.taken = False

    def ask(self, stream_prefix: str, shards: Iterable[int] | None = None) -> None:
        """Trim these shard indexes of the stream soon (None: every shard; an index the stream
        does not have is ignored)."""
        if not self.taken:
            return
        if shards is None:
            self.pending[stream_prefix] = None
        elif (found := self.pending.setdefault(stream_prefix, set())) is not None:
            found.update(shards)
        self._arrived.set()

    async def wait(self) -> None:
        """Return once some request is pending."""
        await self._arrived.wait()

    def take(self) -> dict[str, frozenset[int] | None]:
        """The pending requests, forgotten here."""
        taken = {p: None if s is None else frozenset(s) for p, s in self.pending.items()}
        self.pending.clear()
        self._arrived = trio.Event()
        return taken


class Streams(drain_watch.Streams, Protocol):
    """What retention needs of the registry (`rsc.actors.registry.Registry`): what the drain
    watch needs, where to say what it did, and the early trims asked for."""

    retention_figures: RetentionFigures
    trim_requests: TrimRequests


@attrs.define
class _Pace:
    """At most `per_s` calls a second (None: no bound)."""

    per_s: float | None

    async def take(self, calls: int) -> None:
        if self.per_s is None:
            return
        await trio.sleep(calls / self.per_s)


class Retainer:
    """The state of the retention schedule between rounds (see the module)."""

    def __init__(self, streams: Streams, shards_per_s: float | None) -> None:
        self.streams = streams
        self.pace = _Pace(shards_per_s)
        #: (stream, group) -> when it was first seen with no member (ms), while it has none.
        self.idle_since: dict[tuple[str, str], int] = {}

    async def round(self) -> None:
        """Trim every stream with a policy once. Raises `TermFenced` (a standby: nothing
        trimmed), `StoreError` when the stream list cannot be read."""
        for prefix in await self.streams.stream_prefixes():
            try:
                await self.trim_stream(prefix)
            except TermFenced:
                raise
            except ROUND_FAILURES as exc:
                log_round_failure(log, f"retention of {prefix}", exc)

    async def requested(self) -> None:
        """Trim the shards reported full since the last call (see `TrimRequests`)."""
        for prefix, shards in self.streams.trim_requests.take().items():
            try:
                await self.trim_stream(prefix, only=shards)
            except TermFenced:
                raise
            except ROUND_FAILURES as exc:
                log_round_failure(log, f"early retention of {prefix}", exc)

    async def trim_stream(self, stream_prefix: str, only: frozenset[int] | None = None) -> None:
        """Apply the stream's policy to each readable shard key (nothing without a policy), or
        to those of them whose index is in `only`."""
        actor: Any = self.streams.running_actor(AggregateId(stream_prefix))
        if actor is None:
            actor = await self.streams.stream(stream_prefix, create=False)
        state: StreamState | None = actor.state
        if state is None or state.deleted or state.retention is None:
            return
        policy = state.retention
        now = self.streams.clock.now_ms()
        released = self.released(state, policy, now)
        shards = [s for s in state.layout.shards if s.readable and (only is None or s.index in only)]
        figures = self.streams.retention_figures
        if stream_prefix not in figures.loaded:
            await self._load_totals(stream_prefix, shards)
        oldest: dict[str, int] = {}
        for start in range(0, len(shards), BATCH):
            batch = shards[start : start + BATCH]
            await self.pace.take(len(batch))
            todo = list(batch)
            for _ in range(MORE_ROUNDS):
                calls = [TrimCall(s.key, policy, self.streams.clock.now_ms(), released) for s in todo]
                results = await self.streams.effects.trim(calls)
                for shard, result in zip(todo, results, strict=True):
                    await self._record(stream_prefix, shard, result)
                    for group, ms in result.oldest_ms.items():
                        oldest[group] = min(ms, oldest.get(group, ms))
                todo = [s for s, r in zip(todo, results, strict=True) if r.more]
                if not todo:
                    break
        if only is not None:
            return  # the ages are of every shard: the scheduled round says them
        for group in state.groups:
            found = oldest.get(group)
            age = 0.0 if found is None else max(0.0, (now - found) / 1000)
            figures.oldest_age_s[(stream_prefix, group)] = age

    def released(self, state: StreamState, policy: Retention, now_ms: int) -> tuple[str, ...]:
        """The groups of the stream that no longer hold the watermark: no member for the
        policy's `inactiveGroupMs` (none without it)."""
        out: list[str] = []
        for group in state.groups:
            slot = (state.stream_prefix, group)
            actor = self.streams.running_actor(AggregateId(state.stream_prefix, group))
            group_state = None if actor is None else actor.state
            if group_state is not None and not group_state.deleted and group_state.members:
                self.idle_since.pop(slot, None)
                continue
            since = self.idle_since.setdefault(slot, now_ms)
            limit = policy.inactive_group_ms
            if limit is not None and now_ms - since >= limit:
                out.append(group)
        for slot in [s for s in self.idle_since if s[0] == state.stream_prefix and s[1] not in state.groups]:
            del self.idle_since[slot]
        return tuple(sorted(out))

    async def _load_totals(self, stream_prefix: str, shards: Sequence[Shard]) -> None:
        counts = await self.streams.effects.trimmed_counts([s.key for s in shards])
        figures = self.streams.retention_figures
        for found in counts.values():
            for field, n in found.items():
                if field == TRIMMED_TOTAL_FIELD:
                    figures.trimmed[stream_prefix] = figures.trimmed.get(stream_prefix, 0) + n
                else:
                    slot = (stream_prefix, field)
                    figures.lost[slot] = figures.lost.get(slot, 0) + n
        figures.loaded.add(stream_prefix)

    async def _record(self, stream_prefix: str, shard: Shard, result: Trimmed) -> None:
        figures = self.streams.retention_figures
        if result.removed:
            figures.trimmed[stream_prefix] = figures.trimmed.get(stream_prefix, 0) + result.removed
        if not result.lost:
            return
        for group, n in sorted(result.lost.items()):
            slot = (stream_prefix, group)
            figures.lost[slot] = figures.lost.get(slot, 0) + n
            log.warning(
                "retention removed %d entr%s of shard %d of %s that group %r had not acknowledged "
                "(trimmedUnseen; the stream's retention policy)",
                n,
                "y" if n == 1 else "ies",
                shard.index,
                stream_prefix,
                group,
            )
        command = RecordRetentionLoss(
            shard.index, tuple(sorted(result.lost.items())), self.streams.clock.now_ms()
        )
        await self.streams.ask_stream(stream_prefix, command)


async def watch_retention(
    streams: Streams,
    every_s: float,
    shards_per_s: float | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trim every stream with a retention policy every `every_s` (0: never), forever, at most
    `shards_per_s` trim calls a second, and the shards reported full in between
    (`Streams.trim_requests`) as they are reported. Raises nothing: a failed round is tried
    again."""
    task_status.started()
    if every_s <= 0:
        return
    retainer = Retainer(streams, shards_per_s)
    streams.trim_requests.taken = True
    next_round = trio.current_time() + every_s
    while True:
        with trio.move_on_at(next_round):
            await streams.trim_requests.wait()
        try:
            if trio.current_time() >= next_round:
                # The next round is due `every_s` from this one's start, whether it fails or
                # not (a failure tried again at once would spin on Redis, a standby too).
                next_round = trio.current_time() + every_s
                await retainer.round()
            else:
                await retainer.requested()
                await trio.sleep(REQUEST_GAP_S)
        except TermFenced:
            retainer.idle_since.clear()  # a standby: once active again, idle times start anew
        except ROUND_FAILURES as exc:
            log_round_failure(log, "retention round", exc)


@attrs.frozen
class GroupLoss:
    """What retention removed of one stream before one group acknowledged it: in all and per
    shard index (shards with a loss only), as counted in Redis when the entries went."""

    total: int
    per_shard: dict[int, int]


async def group_loss(streams: Streams, state: StreamState, group: str) -> GroupLoss:
    """The entries `group` lost to retention on each shard of the stream in `state` that still
    has a key (retired ones included while their key is kept). Raises `StoreUnavailable`."""
    shards = {s.key: s.index for s in state.layout.shards}
    counts = await streams.effects.trimmed_counts(shards)
    per_shard = {shards[key]: found[group] for key, found in counts.items() if found.get(group)}
    return GroupLoss(sum(per_shard.values()), dict(sorted(per_shard.items())))

"""Corrections after Redis lost data: rebuilt streams, recreated groups, checked actors.

`rsc.actors.dataset` notices a loss; what the registry then does about it is here:

- a stream Redis holds nothing of (not even its deletion) while a party knows a layout of it,
  or while shard keys of it are in Redis, was lost (`LossCorrections.stream_lost`); it is
  rebuilt above every version the fleet reported, over the shard keys Redis still holds
  (`rebuild`; the SCANs looking for them are bounded), and the streams rebuilt this term are
  remembered (`rebuilt`: groups made on them start at `0`);
- each rebuilt stream and recreated group is reported (`DATA_LOSS`, `REBUILT`);
- once a loss is noticed, every running actor compares its stored revision and repairs its
  side effects, and members of 0.1.0 holding shards are fenced (`check_all`);
- partial loss: running actors compare their stored revision in rotation (`sweep`).

Imports `rsc.events` and the actor modules below the registry; it is given the registry's
running actors as a function (no import back).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

from rsc.actors.actor import Actor, Reply
from rsc.actors.aggregates import GroupActor, GroupAggregate
from rsc.actors.clock import Clock
from rsc.actors.dataset import DATA_LOSS, EVERYTHING, LEASE, REBUILT, ROLLBACK, sweep
from rsc.actors.effects.port import Effects
from rsc.actors.errors import ActorStopped, StoreError
from rsc.actors.keys import AggregateId
from rsc.events.commands import AdoptShardKeys, CreateStream, RemoveMember, StreamCommand
from rsc.events.errors import CoordinationError
from rsc.events.events import ShardsAdded, StreamEvent
from rsc.events.model import MAX_COUNTER, Layout, Timing
from rsc.events.placement import shard_key
from rsc.events.stream import StreamState
from rsc.events.versions import SEAL_LEVEL

log = logging.getLogger("rsc.registry")

#: How long a stream whose shard keys were looked for (a SCAN) and not found is not looked at
#: again: a member that keeps heartbeating about a stream Redis never held costs one SCAN so often.
EVIDENCE_RETRY_MS = 10_000
#: At most so many of those SCANs a minute, one at a time, for all names together.
EVIDENCE_SCANS_PER_MINUTE = 12
MAX_EVIDENCE_ENTRIES = 10_000
#: How often a stream whose parties route by a newer layout is looked at for shard keys only
#: that layout named (`LossCorrections.behind_the_fleet`).
ORPHAN_LOOK_MS = 10_000


class AskStream(Protocol):
    """`Registry.ask_stream`: a command to a stream's actor (`create`: the third argument)."""

    def __call__(
        self, stream_prefix: str, command: StreamCommand, create: bool | None
    ) -> Awaitable[Reply[StreamState, StreamEvent]]: ...


class Settings(Protocol):
    """The registry's settings the corrections read (`RegistrySettings`)."""

    @property
    def auto_create_streams(self) -> bool: ...

    @property
    def timing(self) -> Timing: ...  # its lease: members are fenced once per loss

    @property
    def sweep_per_round(self) -> int: ...  # partial-loss sweep: so many actors a round (0: none)

    @property
    def sweep_every_s(self) -> float: ...


class LossCorrections:
    """What the registry does about data Redis lost (see the module)."""

    def __init__(
        self,
        nursery: trio.Nursery,
        effects: Effects,
        clock: Clock,
        running: Callable[[], Sequence[Actor[Any, Any, Any]]],
        settings: Settings,
    ) -> None:
        self.nursery = nursery
        self.effects = effects
        self.clock = clock
        self.running = running
        self.settings = settings
        #: Streams rebuilt this term after Redis lost them: groups made on them start at `0`.
        self.rebuilt: set[str] = set()
        #: When each stream may next be looked at for shard keys a lost layout named.
        self._orphan_looks: dict[str, int] = {}
        #: When each group last had its 0.1.0 members fenced after a loss (`check_all`).
        self._blind_fenced_at: dict[AggregateId, int] = {}
        #: Streams whose shard keys were looked for and not found, until when not to look again.
        self._no_keys_until: dict[str, int] = {}
        self._scans: list[int] = []
        self._scanning = trio.Lock()

    def new_term(self) -> None:
        """A term ended: what was learnt of the streams is stale."""
        self.rebuilt.clear()
        self._no_keys_until.clear()

    # --- lost streams and groups -------------------------------------------

    async def stream_lost(
        self,
        stream_prefix: str,
        state: StreamState | None,
        seen_version: int,
        create: bool | None,
        only_new: bool,
    ) -> bool:
        """Whether Redis lost the stream whose stored `state` is `state` (None: nothing in Redis).

        `seen_version`: the highest layout version the asking member (not a join) or producer
        has been told; `create`: the caller's override of auto-creation (None: a heartbeat's
        first use). Where the caller may not create it, only with evidence in Redis: shard keys
        of that stream (`_leaves_keys`). A heartbeat that may create it rebuilds it too if shard
        keys of that name exist (Redis lost it while no coordinator ran, and a join came before
        any party that knows a layout). Raises `StoreError` (the SCAN)."""
        # (A version at the counters' limit cannot be rebuilt above: created as new instead.)
        lost = state is None and 0 < seen_version < MAX_COUNTER and not only_new
        may_create = self.settings.auto_create_streams if create is None else create
        if lost and not may_create:
            lost = await self._leaves_keys(stream_prefix)  # where heartbeats may not create: evidence
        elif state is None and not lost and create is None and self.settings.auto_create_streams:
            lost = not only_new and await self._leaves_keys(stream_prefix)
        return lost

    async def rebuild(self, command: CreateStream, seen_version: int, level: int) -> CreateStream:
        """A lost stream: its first layout is above the version the fleet reported (so that
        members and producers take it as a layout change), with the shard keys Redis still
        holds, or that producers routing by the lost layout have appended to since (found by
        name), plus any index between them; the default count when none is found. A found key
        Redis holds sealed (at feature `level` 2 and above) was DRAINING or RETIRED: it is
        DRAINING again (read to its end, then retired), never ACTIVE.

        Raises `StoreError` (the SCAN, the seals)."""
        found = dict(await self._scan(command.stream_prefix))
        sealed: frozenset[int] = frozenset()
        if found and level >= SEAL_LEVEL:
            evidence = await self.effects.drain_evidence(found.values())
            sealed = frozenset(i for i, key in found.items() if evidence[key].sealed)
        if found:  # the namespace is the part of a found key before its name
            some = found[min(found)]
            namespace = some[: some.index(f"{command.stream_prefix}:{{")]
            for index in range(min(found), max(found) + 1):
                found.setdefault(index, shard_key(command.stream_prefix, index, namespace=namespace))
        return attrs.evolve(
            command,
            metadata_version=seen_version + 1,
            found_keys=tuple(sorted(found.items())),
            sealed=sealed,
        )

    def stream_rebuilt(self, stream_prefix: str, seen_version: int, layout: Layout, found_keys: bool) -> None:
        """Remember (for this term) and report a stream rebuilt at `layout`. Raises nothing."""
        self.rebuilt.add(stream_prefix)
        DATA_LOSS.noticed(
            REBUILT,
            f"stream {stream_prefix!r}: nothing of it in Redis while "
            + (
                f"its members or producers know layout version {seen_version}"
                if seen_version
                else "shard keys of it are there"
            )
            + f"; rebuilt at version {layout.metadata_version} "
            f"with {len(layout.shards)} shard(s) "
            + ("found in Redis" if found_keys else "(none found: the default count)"),
        )

    @staticmethod
    def group_recreated(stream_prefix: str, group: str, seen_version: int) -> None:
        """Report a group recreated after Redis lost it. Raises nothing."""
        DATA_LOSS.noticed(
            REBUILT,
            f"group {group!r} of stream {stream_prefix!r}: nothing of it in Redis "
            f"while a member knows layout version {seen_version}; recreated, its "
            "consumer groups at 0 (its members rejoin)",
        )

    async def scan(self, stream_prefix: str) -> dict[int, str]:
        """The shard keys of `stream_prefix` Redis holds now, for a stream that exists (see
        `_scan`: bounded; a name found without keys earlier is looked at again). Raises
        `StoreError`."""
        self._no_keys_until.pop(stream_prefix, None)
        return await self._scan(stream_prefix)

    def behind_the_fleet(self, stream_prefix: str, level: int, ask: AskStream) -> None:
        """A party routes by a layout newer than the stored one (Redis came back from an older
        copy while it routed by the newer): look soon for shard keys of the stream only that
        lost layout named (producers appended to them), and have them read to their end and
        retired (`AdoptShardKeys` through `ask`: DRAINING, sealed). At most one look per
        `ORPHAN_LOOK_MS` per stream, bounded like every search for shard keys (`scan`); from
        feature `level` 2 (seals). Raises nothing."""
        now = self.clock.now_ms()
        if level < SEAL_LEVEL or self._orphan_looks.get(stream_prefix, -1) > now:
            return
        if len(self._orphan_looks) > MAX_EVIDENCE_ENTRIES:
            self._orphan_looks.clear()
        self._orphan_looks[stream_prefix] = now + ORPHAN_LOOK_MS
        self.nursery.start_soon(self._adopt_orphans, stream_prefix, ask)

    async def _adopt_orphans(self, stream_prefix: str, ask: AskStream) -> None:
        try:
            found = await self.scan(stream_prefix)
            if not found:
                return
            reply = await ask(stream_prefix, AdoptShardKeys(tuple(sorted(found.items()))), False)
            added = [s.index for e in reply.events if isinstance(e, ShardsAdded) for s in e.shards]
            if added:
                log.warning(
                    "stream %r: shard keys %s are in Redis but not in its stored layout (an older "
                    "copy of Redis came back while producers routed by a newer layout): added "
                    "DRAINING, to be read to their end and retired",
                    stream_prefix,
                    added,
                )
        except (StoreError, ActorStopped, CoordinationError) as exc:
            log.info("stream %r: looking for shard keys of a lost layout failed: %s", stream_prefix, exc)

    async def _leaves_keys(self, stream_prefix: str) -> bool:
        """Whether Redis holds shard keys of `stream_prefix` (`_scan`)."""
        return bool(await self._scan(stream_prefix))

    async def _scan(self, stream_prefix: str) -> dict[int, str]:
        """The shard keys of `stream_prefix` Redis holds (a SCAN of every primary), or none
        found. A name found without any is not looked at again for `EVIDENCE_RETRY_MS`, and
        there is one SCAN at a time, at most `EVIDENCE_SCANS_PER_MINUTE` for all names
        together: heartbeats naming ever new streams cannot make Redis scan in a loop."""
        now = self.clock.now_ms()
        if self._no_keys_until.get(stream_prefix, 0) > now:
            return {}
        self._scans = [t for t in self._scans if t > now - 60_000]
        if len(self._scans) >= EVIDENCE_SCANS_PER_MINUTE or self._scanning.locked():
            return {}
        self._scans.append(now)
        async with self._scanning:
            found = await self.effects.find_shard_keys(stream_prefix)
        if found:
            self._no_keys_until.pop(stream_prefix, None)
            return found
        if len(self._no_keys_until) >= MAX_EVIDENCE_ENTRIES:
            self._no_keys_until.clear()
        self._no_keys_until[stream_prefix] = now + EVIDENCE_RETRY_MS
        return {}

    # --- running actors ------------------------------------------------------

    def check_all(self, kind: str, why: str) -> None:
        """Redis lost data (`rsc.actors.dataset`): every running actor compares its stored
        revision with its own, writes what it knows back where Redis holds less, and repairs
        every side effect as after a loss (shard keys, consumer groups at `0`, owner tokens).

        Does not wait (the checks ride on each actor's next batch); raises nothing."""
        owner_tokens_lost = kind in (EVERYTHING, ROLLBACK, LEASE)  # not a restart that kept the data
        now = self.clock.now_ms()
        for actor in self.running():  # (an actor still starting loads afresh anyway)
            actor.check_store(why)
            aggregate_id = actor.aggregate.aggregate_id
            # Once per loss: the notices of one loss (lease, marker) come within a second.
            last = self._blind_fenced_at.get(aggregate_id, -(10**15))
            group = isinstance(actor.aggregate, GroupAggregate)
            if owner_tokens_lost and group and now - last >= self.settings.timing.lease_ttl_ms:
                self._blind_fenced_at[aggregate_id] = now
                self.nursery.start_soon(self._fence_blind_members, actor)

    async def _fence_blind_members(self, actor: GroupActor) -> None:
        """After a loss, members of 0.1.0 (client feature level 1) holding shards are fenced:
        their poller drops a shard whose owner token Redis lost and never says so (no
        `stalledShards`), so the shard would stay unread while the group believes it read.
        Fenced (`REMOVED`: a reason they know), they rejoin at once and read afresh; newer
        members report what they cannot read and keep their shards."""
        state = actor.state
        if state is None or state.deleted:
            return
        blind = sorted(
            m.member_id for m in state.members.values() if m.client.feature_level < 2 and m.installed
        )
        for member_id in blind:
            log.warning(
                "%s: fencing member %s after Redis lost data: its client (%s %s) cannot report "
                "shards it no longer reads; it rejoins and reads them afresh",
                actor.aggregate.aggregate_id,
                member_id,
                state.members[member_id].client.name,
                state.members[member_id].client.version,
            )
            with contextlib.suppress(CoordinationError, ActorStopped, StoreError):
                await actor.ask(RemoveMember(member_id, self.clock.now_ms()))

    async def sweep(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Partial loss: `sweep_per_round` running actors compare their stored revision each
        `sweep_every_s`, in rotation (a bounded number of Redis commands a second), forever.

        Raises nothing of its own (`check_store` only asks)."""
        task_status.started()
        if self.settings.sweep_per_round > 0:
            await sweep(self.running, self.settings.sweep_per_round, self.settings.sweep_every_s)

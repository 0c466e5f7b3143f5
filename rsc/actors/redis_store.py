"""`Store` on Redis: one Lua script appends events and CAS-replaces the snapshot.

Keys (key layout v1, one hash tag per aggregate, so also on a cluster):

* `rsc:v1:{<tag>}:snapshot`: hash `revision`, `lastId`, `schemaVersion` (the
  journal schema of the last append), `fence` (the highest coordinator token that
  wrote or loaded it), and from the latest checkpoint `state`, `stateRevision`,
  `stateId`;
* `rsc:v1:{<tag>}:journal`: stream of entries `kind`, `rev`, `data` and, from
  journal schema 2 (feature level 2), `v`: the version of the event's data;
* `rsc:v1:{<tag>}:checkpoints`: list of `"<entry id> <revision>"` of the
  checkpoints still in the journal, oldest first.

The fence lives in the snapshot hash, not next to the coordinator lease,
because on a cluster only keys of one slot can be checked in one script.

What is written follows the deployment's finalized feature level
(`rsc.actors.features`): at level 1 only what 0.1.0 reads (schema 1, no `v`),
so a 0.1.0 coordinator can take over or be rolled back to. Every schema up to
`MAX_JOURNAL_SCHEMA` is read (an entry without `v` is version 1); a newer one is
refused with an error naming it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rsc import __version__
from rsc.actors.errors import ConcurrencyConflict, TermFenced, UnsupportedSchema
from rsc.actors.features import Features, FeatureSource
from rsc.actors.keys import DEFAULT_KEYS, AggregateId, KeySpace
from rsc.actors.store import CHECKPOINT, Appended, FenceToken, JournalEntry, Loaded, level_of_events
from rsc.actors.store_connection import Scripts, redis_errors
from rsc.events.versions import EVENT_VERSIONS, MAX_JOURNAL_SCHEMA, current_event_version, level_of_schema
from rsc.lua import script
from rsc.resp import Multiplexed

#: Told of a fence above this coordinator's token (the highest fence); True when the term's
#: token was moved above it (the lease is ours: Redis lost the token counter), so trying again
#: may pass.
FenceFloor = Callable[[int], Awaitable[bool]]


class RedisStore:
    """The `Store` port on Redis (standalone or cluster) through coredis, its scripts on the
    lean connection `lean` where there is one (`rsc.actors.store_connection.open_lean`)."""

    def __init__(
        self,
        redis: Any,
        retention: int = 10_000,
        fence_token: FenceToken | None = None,
        features: FeatureSource | None = None,
        keys: KeySpace = DEFAULT_KEYS,
        lean: Multiplexed | None = None,
    ) -> None:
        self.redis = redis
        #: How the scripts are sent: on `lean`, the lean connection, where there is one.
        self.scripts = Scripts(redis, lean)
        self.keys = keys
        self.retention = retention
        #: The current token of this coordinator's term (None: an unfenced reader, as `rsc journal`).
        self.fence_token = fence_token
        #: The finalized feature level, which says what may be written (one of its own if None).
        self.features: FeatureSource = features or Features(redis, term=fence_token, keys=keys)
        self._append = redis.register_script(script("coordinator/append"))
        self._load = redis.register_script(script("coordinator/load"))
        self._restore = redis.register_script(script("coordinator/restore"))
        #: Asked when a fence is above our token (see `FenceFloor`); None: that is `TermFenced`.
        self.on_fenced: FenceFloor | None = None

    async def _fenced_again(self, exc: TermFenced) -> bool:
        """Whether to try once more after `exc` (our token was moved above its fence)."""
        return exc.fence is not None and self.on_fenced is not None and await self.on_fenced(exc.fence)

    async def load(self, aggregate: AggregateId) -> Loaded:
        if self.fence_token is None:  # an unfenced reader (`rsc journal`): reads only
            return await self._read_loaded(aggregate)
        try:
            return await self._fenced_load(aggregate, self.fence_token())
        except TermFenced as exc:
            if not await self._fenced_again(exc):
                raise
            return await self._fenced_load(aggregate, self.fence_token())

    async def _fenced_load(self, aggregate: AggregateId, token: int) -> Loaded:
        """Raise the aggregate's fence to `token` and read it, in one round trip (`load.lua`).

        Raises `TermFenced` if its fence is higher already, `UnsupportedSchema`, `StoreError`."""
        keys = [self.keys.snapshot(aggregate), self.keys.journal(aggregate)]
        with redis_errors(f"loading {aggregate}"):
            result = await self.scripts.one(self._load, keys, [token])
        if result[0] == "fenced":
            raise _fenced(aggregate, int(result[1]), token)
        if result[0] == "absent":
            return Loaded(0, None, None, ())
        return self._loaded(aggregate, _pairs(result[1]), [_lua_entry(raw) for raw in result[2]])

    async def _read_loaded(self, aggregate: AggregateId) -> Loaded:
        with redis_errors(f"loading {aggregate}"):
            snapshot = await self.redis.hgetall(self.keys.snapshot(aggregate))
            if "revision" not in snapshot:
                return Loaded(0, None, None, ())
            start = "(" + snapshot["stateId"] if "state" in snapshot else "-"
            tail = await self.redis.xrange(self.keys.journal(aggregate), start, "+")
        return self._loaded(aggregate, snapshot, [_entry(raw) for raw in tail])

    @staticmethod
    def _loaded(aggregate: AggregateId, snapshot: dict[str, str], tail: list[JournalEntry]) -> Loaded:
        """The aggregate as its snapshot and the journal after the snapshot's checkpoint hold it.

        Raises `UnsupportedSchema`."""
        if "revision" not in snapshot:
            return Loaded(0, None, None, ())
        schema = int(snapshot.get("schemaVersion", 0))
        check_schema(aggregate, schema)
        checkpoint = None
        if "state" in snapshot:
            checkpoint = JournalEntry(
                snapshot["stateId"], CHECKPOINT, int(snapshot["stateRevision"]), snapshot["state"]
            )
        events = tuple(e for e in tail if not e.is_checkpoint)
        return Loaded(int(snapshot["revision"]), snapshot.get("lastId"), checkpoint, events, schema)

    async def append(
        self,
        aggregate: AggregateId,
        expected_revision: int,
        events: Sequence[tuple[str, str]],
        checkpoint: str | None = None,
    ) -> Appended:
        token = self.fence_token() if self.fence_token is not None else 0
        kinds = [kind for kind, _ in events]
        schema = await self.features.schema_for_write(lambda level: level_of_events(kinds, level))
        state = await self.features.current()
        args: list[str | int] = [expected_revision, schema, self.retention, token, len(events)]
        for kind, data in events:
            version = current_event_version(kind, state.level, EVENT_VERSIONS) if schema >= 2 else ""
            args += [kind, data, version]
        args.append(checkpoint or "")
        keys = [self.keys.snapshot(aggregate), self.keys.journal(aggregate), self.keys.checkpoints(aggregate)]
        with redis_errors(f"appending to {aggregate}"):
            result = await self.scripts.one(self._append, keys, args)
        if result[0] == "fenced":
            fenced = _fenced(aggregate, int(result[1]), token)
            if await self._fenced_again(fenced):
                return await self.append(aggregate, expected_revision, events, checkpoint)
            raise fenced
        if result[0] == "conflict":
            raise ConcurrencyConflict(expected_revision, int(result[1]))
        return Appended(int(result[1]), str(result[2]))

    async def revision(self, aggregate: AggregateId) -> int:
        with redis_errors(f"checking {aggregate}"):
            raw = await self.redis.hget(self.keys.snapshot(aggregate), "revision")
        return int(raw or 0)

    async def restore(
        self, aggregate: AggregateId, expected_revision: int, revision: int, state: str, reason: str
    ) -> Appended:
        token = self.fence_token() if self.fence_token is not None else 0
        schema = await self.features.schema_for_write()
        keys = [self.keys.snapshot(aggregate), self.keys.journal(aggregate), self.keys.checkpoints(aggregate)]
        args = [expected_revision, revision, schema, token, state, reason]
        with redis_errors(f"restoring {aggregate}"):
            result = await self.scripts.one(self._restore, keys, args)
        if result[0] == "fenced":
            fenced = _fenced(aggregate, int(result[1]), token)
            if await self._fenced_again(fenced):
                return await self.restore(aggregate, expected_revision, revision, state, reason)
            raise fenced
        if result[0] == "conflict":
            raise ConcurrencyConflict(expected_revision, int(result[1]))
        return Appended(int(result[1]), str(result[2]))

    async def read(
        self, aggregate: AggregateId, start: str = "-", end: str = "+", count: int | None = None
    ) -> list[JournalEntry]:
        with redis_errors(f"reading {aggregate}"):
            entries = await self.redis.xrange(self.keys.journal(aggregate), start, end, count=count)
        return [_entry(e) for e in entries]


def _fenced(aggregate: AggregateId, fence: int, token: int) -> TermFenced:
    message = f"{aggregate}: a newer coordinator term (token {fence}) owns it; ours is {token}"
    return TermFenced(message, fence, token)


def check_schema(aggregate: AggregateId, schema: int) -> None:
    """Refuse a snapshot of a journal schema this release cannot read (older ones are read)."""
    if not 1 <= schema <= MAX_JOURNAL_SCHEMA:
        raise UnsupportedSchema(
            f"{aggregate}: journal schemaVersion {schema} (written at feature level "
            f"{level_of_schema(schema)} or above); this release ({__version__}) reads schemas 1 to "
            f"{MAX_JOURNAL_SCHEMA}: run a release that supports it"
        )


def _entry(raw: Any) -> JournalEntry:
    """A journal entry as coredis answers `XRANGE`."""
    return _journal_entry(str(raw.identifier), raw.field_values)


def _lua_entry(raw: Any) -> JournalEntry:
    """A journal entry as a script answers `XRANGE`: `[id, [field, value, ...]]`."""
    return _journal_entry(str(raw[0]), _pairs(raw[1]))


def _pairs(flat: Any) -> dict[str, str]:
    """`[field, value, ...]` (a hash or an entry as a script answers it) as a dict."""
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def _journal_entry(identifier: str, fields: Any) -> JournalEntry:
    version = int(fields.get("v", 1))
    restored = str(fields.get("restored", ""))
    return JournalEntry(identifier, fields["kind"], int(fields["rev"]), fields["data"], version, restored)

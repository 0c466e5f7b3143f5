"""`MemoryEffects`: the `Effects` port kept in dicts, the fake of the time-driven actor tests.

It keeps the rules the actors rely on (the first seal stays, an existing consumer group is not
moved, a token is cleared only for the incarnation it names); Redis-only figures (statistics,
dead letters) are empty.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from rsc.actors.effects.inspection import ShardStats
from rsc.actors.effects.positions import PendingEntry
from rsc.actors.effects.shard_keys import shard_key_pattern
from rsc.actors.effects.trimming import TRIM_LIMIT, TrimCall, Trimmed
from rsc.events.drain import DrainEvidence
from rsc.events.group_position import ShardPosition
from rsc.events.slots import Topology
from rsc.events.wire import OwnerToken


class MemoryEffects:
    """A fake `Effects` that keeps everything in dicts (for time-driven actor tests); raises nothing."""

    def __init__(self) -> None:
        self.registered: set[str] = set()
        self.shard_keys: set[str] = set()
        self.consumer_groups: dict[tuple[str, str], str] = {}
        self.tokens: dict[tuple[str, str], OwnerToken] = {}
        self.sealed: dict[str, int] = {}
        #: What `drain_evidence` says of a key (default: sealed as sealed here, nothing left).
        self.evidence: dict[str, DrainEvidence] = {}
        #: The calls `trim` was given, in order (the fake holds no entries: it removes none).
        self.trims: list[TrimCall] = []
        #: The positions `set_position` set: (shard key, group, last-delivered id).
        self.positions_set: list[tuple[str, str, str]] = []
        #: Retired keys and the time to live they were given.
        self.expiring: dict[str, int] = {}
        #: Streams by who created them, and who created each (`record_created`).
        self.created: dict[str, set[str]] = {}
        self.creators: dict[str, str] = {}

    # --- the stream catalog ---------------------------------------------------------------

    async def register_stream(self, stream_prefix: str) -> None:
        self.registered.add(stream_prefix)

    async def unregister_stream(self, stream_prefix: str) -> None:
        self.registered.discard(stream_prefix)
        owner = self.creators.pop(stream_prefix, None)
        if owner is not None:
            self.created[owner].discard(stream_prefix)

    async def stream_counts(self, owner: str, pending: Collection[tuple[str, str]]) -> tuple[int, int]:
        mine = self.created.get(owner, set())
        unregistered = len({name for name, _ in pending} - self.registered)
        unrecorded = len({name for name, creator in pending if creator == owner} - mine)
        return len(self.registered) + unregistered, len(mine) + unrecorded

    async def record_created(self, owner: str, stream_prefix: str) -> None:
        self.created.setdefault(owner, set()).add(stream_prefix)
        self.creators[stream_prefix] = owner

    async def streams(self) -> set[str]:
        return set(self.registered)

    # --- shard keys and consumer groups ---------------------------------------------------

    async def ensure_streams(self, shard_keys: Iterable[str]) -> None:
        self.shard_keys.update(shard_keys)

    async def seal(self, shard_keys: Iterable[str], version: int) -> None:
        for key in shard_keys:
            self.sealed[key] = version

    async def expire_streams(self, shard_keys: Iterable[str], after_ms: int) -> None:
        for key in shard_keys:
            self.expiring.setdefault(key, after_ms)

    async def delete_streams(self, shard_keys: Iterable[str]) -> None:
        gone = set(shard_keys)
        self.shard_keys -= gone
        self.consumer_groups = {k: v for k, v in self.consumer_groups.items() if k[0] not in gone}
        self.tokens = {k: v for k, v in self.tokens.items() if k[0] not in gone}

    async def find_shard_keys(self, stream_prefix: str) -> dict[int, str]:
        pattern = shard_key_pattern(stream_prefix, "")
        return {i: k for k in sorted(self.shard_keys) if (i := pattern.index_of(k)) is not None}

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None:
        for key in shard_keys:
            self.shard_keys.add(key)
            self.consumer_groups.setdefault((key, group), start_id)

    async def destroy_consumer_groups(self, shard_keys: Iterable[str], group: str) -> None:
        for key in shard_keys:
            self.consumer_groups.pop((key, group), None)
            self.tokens.pop((key, group), None)

    async def prune_consumers(self, shard_keys: Iterable[str], group: str, live: Iterable[str]) -> int:
        return 0

    # --- owner tokens ---------------------------------------------------------------------

    async def set_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        for key, token in tokens.items():
            self.tokens[key, group] = token

    async def clear_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        for key, token in tokens.items():
            current = self.tokens.get((key, group))
            if current and (current.member_id, current.incarnation) == (token.member_id, token.incarnation):
                del self.tokens[key, group]

    async def owners(self, group: str, shard_keys: Iterable[str]) -> dict[str, OwnerToken]:
        return {k: self.tokens[k, group] for k in shard_keys if (k, group) in self.tokens}

    async def sync_owners(
        self, group: str, shard_keys: Iterable[str], tokens: Mapping[str, OwnerToken]
    ) -> None:
        for key in set(shard_keys) | set(tokens):
            if key in tokens:
                self.tokens[key, group] = tokens[key]
            else:
                self.tokens.pop((key, group), None)

    # --- dead letters ---------------------------------------------------------------------

    async def dead_letter_counts(self, shard_keys: Iterable[str]) -> dict[str, int]:
        return dict.fromkeys(shard_keys, 0)

    async def dead_letters(
        self, shard_key: str, count: int, after: str | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        return []

    async def replay_dead_letters(
        self, shard_key: str, ids: Sequence[str], count: int
    ) -> list[tuple[str, str]]:
        return []

    # --- inspection -----------------------------------------------------------------------

    async def ping(self) -> bool:
        return True

    async def topology(self) -> Topology | None:
        return None

    async def shard_stats(self, shard_keys: Iterable[str]) -> dict[str, ShardStats]:
        return {key: ShardStats(0, ()) for key in shard_keys}

    async def drain_evidence(self, shard_keys: Iterable[str]) -> dict[str, DrainEvidence]:
        return {k: self.evidence.get(k, DrainEvidence(k in self.sealed, False)) for k in shard_keys}

    # --- trimming -------------------------------------------------------------------------

    async def trim(self, calls: Sequence[TrimCall], limit: int = TRIM_LIMIT) -> list[Trimmed]:
        self.trims.extend(calls)
        return [Trimmed(0, False, {}) for _ in calls]

    async def trimmed_counts(self, shard_keys: Iterable[str]) -> dict[str, dict[str, int]]:
        return {key: {} for key in shard_keys}

    # --- positions (no entries in memory: every key empty, every group at its start) -----

    async def positions(self, shard_keys: Iterable[str], group: str) -> dict[str, ShardPosition]:
        return {
            k: ShardPosition(k in self.shard_keys, None, "0-0", 0, 0, True, "0-0", 0, 0) for k in shard_keys
        }

    async def count_entries(
        self, shard_key: str, after: str, upto: str, limit: int
    ) -> tuple[int, str | None]:
        return 0, None

    async def set_position(self, shard_key: str, group: str, last_id: str, entries_read: int | None) -> int:
        self.positions_set.append((shard_key, group, last_id))
        return 0

    async def oldest_pending(
        self, shard_keys: Iterable[str], group: str, count: int
    ) -> dict[str, list[PendingEntry]]:
        return {key: [] for key in shard_keys}

    async def entry_fields(self, shard_key: str, ids: Iterable[str]) -> dict[str, dict[str, str]]:
        return {}

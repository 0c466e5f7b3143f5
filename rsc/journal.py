"""`rsc journal`: read, replay and verify aggregate journals in Redis.

* `show`: the entries of one aggregate, oldest first, one line each,
  filterable by member, shard or kind;
* `replay --until ID`: the state after the entries up to ID, replayed from
  the oldest retained entry (the group's creation, or a checkpoint);
* `verify`: for each aggregate, replaying the whole retained journal must
  give the snapshot's state, every checkpoint in the journal must equal the
  replay up to it, and revisions must run without gaps. (States hold no
  liveness, so they compare as they are; leases are never journaled.)
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from rsc.actors.actor import Aggregate, fold_loaded
from rsc.actors.aggregates import GroupAggregate, StreamAggregate
from rsc.actors.effects.memory_effects import MemoryEffects
from rsc.actors.errors import UnsupportedSchema
from rsc.actors.keys import DEFAULT_KEYS, AggregateId, KeySpace
from rsc.actors.store import JournalEntry, Store
from rsc.events import codec
from rsc.events.model import is_plain_text
from rsc.events.stream import StreamState


def aggregate_for(aggregate_id: AggregateId) -> Aggregate[Any, Any, Any]:
    """The codec and fold of an aggregate, without any effects (read-only tools)."""
    if aggregate_id.group is None:
        return StreamAggregate(aggregate_id, MemoryEffects(), lambda *_: None)
    return GroupAggregate(aggregate_id, MemoryEffects())


def describe(entry: JournalEntry) -> str:
    """One readable line for a journal entry."""
    head = f"{entry.entry_id:<20} #{entry.revision:<6} {entry.kind:<24}"
    if entry.is_checkpoint:
        return f"{head} (whole state at revision {entry.revision})"
    data = json.loads(entry.data)
    data.pop("type", None)
    parts = []
    for key, value in data.items():
        if isinstance(value, str):  # shown as written unless it could disturb a terminal
            text = value if is_plain_text(value, len(value)) and " " not in value else json.dumps(value)
        else:
            text = json.dumps(value, separators=(",", ":"))
        parts.append(f"{key}={text}")
    return f"{head} {' '.join(parts)}"


def matches(entry: JournalEntry, member: str | None, shard: int | None, kinds: Iterable[str]) -> bool:
    """Whether `entry` concerns `member`, `shard` and one of `kinds` (None/empty: any)."""
    kinds = set(kinds)
    if kinds and entry.kind not in kinds:
        return False
    if member is None and shard is None:
        return True
    if entry.is_checkpoint:
        return False
    data = json.loads(entry.data)
    if member is not None and data.get("memberId") != member and member not in data.get("changed", {}):
        return False
    return shard is None or _mentions_shard(data, shard)


def _mentions_shard(data: dict[str, Any], shard: int) -> bool:
    if shard in data.get("shards", ()) or shard in data.get("indexes", ()):
        return True
    if any(shard in shards for shards in data.get("changed", {}).values()):
        return True
    layout_shards = data.get("layout", {}).get("shards", ())
    return any(s.get("index") == shard for s in layout_shards)


async def show(
    store: Store,
    aggregate_id: AggregateId,
    member: str | None = None,
    shard: int | None = None,
    kinds: Iterable[str] = (),
) -> list[JournalEntry]:
    """The retained entries of an aggregate that match the filters, oldest first."""
    kinds = tuple(kinds)
    return [e for e in await store.read(aggregate_id) if matches(e, member, shard, kinds)]


async def replay(store: Store, aggregate_id: AggregateId, until: str = "+") -> Any:
    """The state after the retained entries up to `until` (inclusive), or None."""
    aggregate = aggregate_for(aggregate_id)
    state = None
    for entry in await store.read(aggregate_id, "-", until):
        if entry.is_checkpoint:
            if state is None:
                state = aggregate.state_from_json(entry.data)
            continue
        state = aggregate.evolve(state, aggregate.event_from_json(entry.data, entry.version))
    return state


@attrs.frozen
class Verdict:
    aggregate_id: AggregateId
    ok: bool
    problems: tuple[str, ...]
    entries: int
    revision: int
    #: The journal schema the snapshot names, and how many retained events of each data version.
    schema: int = 0
    versions: Mapping[int, int] = attrs.field(factory=dict)

    def describe_versions(self) -> str:
        counted = ", ".join(f"v{v} x{n}" for v, n in sorted(self.versions.items())) or "none"
        return f"journal schema {self.schema}, event versions {counted}"


#: Fields added after the baseline (0.1.0) that a 0.1.0 writer drops from what it checkpoints.
_AFTER_BASELINE = frozenset({"featureLevel"})


def _same(a: Any, b: Any) -> bool:
    return bool(a == b)


def _same_for_baseline(a: Any, b: Any) -> bool:
    """Equal once the fields a 0.1.0 writer did not know are left out of both."""
    if a == b:
        return True
    if a is None or b is None:
        return False
    left = _without_new_fields(json.loads(codec.to_json(a)))
    right = _without_new_fields(json.loads(codec.to_json(b)))
    return bool(left == right)


def _without_new_fields(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_new_fields(v) for k, v in value.items() if k not in _AFTER_BASELINE}
    if isinstance(value, list):
        return [_without_new_fields(v) for v in value]
    return value


async def verify(store: Store, aggregate_id: AggregateId) -> Verdict:
    """Check that the snapshot, the checkpoints and the journal agree."""
    aggregate = aggregate_for(aggregate_id)
    entries = await store.read(aggregate_id)
    try:
        loaded = await store.load(aggregate_id)
    except UnsupportedSchema as exc:  # written by a newer release: say so, do not guess
        return Verdict(aggregate_id, False, (str(exc),), len(entries), 0)
    versions = dict(collections.Counter(e.version for e in entries if not e.is_checkpoint))
    problems: list[str] = []
    if not entries:
        return Verdict(aggregate_id, False, ("no journal",), 0, loaded.revision, loaded.schema)
    state = None
    # A 0.1.0 coordinator may have written some checkpoints (at schema 1, before the level was
    # raised): it keeps no field it does not know (a client's `featureLevel`), so compare
    # without those, whatever the schema is now.
    same = _same_for_baseline
    # A checkpoint carries the revision of the state it holds (written after that revision's
    # event, which trimming removes; or, written back after a loss, a revision of its own):
    # a journal that starts with one goes on at the next revision.
    expected_revision = entries[0].revision + 1 if entries[0].is_checkpoint else 1
    for entry in entries:
        if entry.is_checkpoint:
            snapshot = aggregate.state_from_json(entry.data)
            if state is None:
                state = snapshot
            elif not same(snapshot, state):
                problems.append(f"checkpoint {entry.entry_id} differs from the replay up to it")
            continue
        if entry.revision != expected_revision:
            problems.append(
                f"entry {entry.entry_id} has revision {entry.revision}, expected {expected_revision}"
            )
        expected_revision = entry.revision + 1
        try:
            state = aggregate.evolve(state, aggregate.event_from_json(entry.data, entry.version))
        except Exception as exc:  # a broken history is what this tool reports
            problems.append(f"entry {entry.entry_id} does not apply: {exc}")
            break
    if entries[-1].revision != loaded.revision:
        problems.append(f"snapshot revision {loaded.revision}, journal ends at {entries[-1].revision}")
    snapshot_state = fold_loaded(aggregate, loaded)
    if not same(snapshot_state, state):
        problems.append("snapshot state differs from the replay of the journal")
    return Verdict(
        aggregate_id, not problems, tuple(problems), len(entries), loaded.revision, loaded.schema, versions
    )


async def every_aggregate(redis: Any, store: Store, keys: KeySpace = DEFAULT_KEYS) -> list[AggregateId]:
    """Every stream the coordinator created, and every group registered with it."""
    found: list[AggregateId] = []
    for prefix in sorted(await redis.smembers(keys.streams)):
        stream_id = AggregateId(prefix)
        found.append(stream_id)
        state = await replay(store, stream_id)
        if isinstance(state, StreamState):
            found.extend(AggregateId(prefix, name) for name in sorted(state.groups))
    return found


def state_json(state: Any) -> str:
    """The state as indented camelCase JSON."""
    return json.dumps(codec.converter.unstructure(state), indent=2)


async def feature_level(redis: Any, keys: KeySpace = DEFAULT_KEYS) -> str:
    """The deployment's feature level in words, read without initializing anything."""
    raw = await redis.hgetall(keys.features)
    if not raw:
        return "feature level: not recorded (1: no coordinator of 0.2.0 or later has run here)"
    return f"feature level {raw.get('level')} (data written up to level {raw.get('written')})"

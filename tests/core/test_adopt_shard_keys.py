"""`AdoptShardKeys`: shard keys a lost layout named join the stored layout DRAINING (two
existing events, so N-1 coordinators replay them), never ACTIVE, never twice, not mid-migration."""

from __future__ import annotations

from rsc.events import stream
from rsc.events.commands import AdoptShardKeys, ChangeShardCount, CreateStream
from rsc.events.model import ReshardMode, ShardState
from rsc.events.placement import shard_key


def created(shards: int = 4) -> stream.StreamState:
    state = stream.fold(stream.decide(None, CreateStream("orders", shards)))
    assert state is not None
    return state


def test_keys_the_layout_lacks_are_added_draining() -> None:
    state = created()
    found = tuple((i, shard_key("orders", i)) for i in range(6))  # 0-3 known, 4-5 lost layout's
    events = stream.decide(state, AdoptShardKeys(found))
    assert [type(e).__name__ for e in events] == ["ShardsAdded", "ShardsDraining"]
    after = stream.fold(events, state)
    assert after is not None
    assert {s.index: s.state for s in after.layout.shards} == {
        **dict.fromkeys(range(4), ShardState.ACTIVE),
        4: ShardState.DRAINING,
        5: ShardState.DRAINING,
    }
    assert after.layout.metadata_version == state.layout.metadata_version + 2
    assert [s.index for s in after.layout.active] == [0, 1, 2, 3]
    assert stream.decide(after, AdoptShardKeys(found)) == []  # once


def test_nothing_is_adopted_mid_migration_or_by_another_name() -> None:
    state = created()
    reshard = ChangeShardCount(6, ReshardMode.QUIESCE, now_ms=1, migrations=True)
    moving = stream.fold(stream.decide(state, reshard), state)
    assert moving is not None
    assert stream.decide(moving, AdoptShardKeys(((9, shard_key("orders", 9)),))) == []
    # an index the layout has, under another name: not a second key for one index
    assert stream.decide(state, AdoptShardKeys(((2, "elsewhere:{orders:2}"),))) == []

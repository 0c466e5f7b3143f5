"""The stream aggregate: creation, scale-out, scale-in to DRAINING, retirement."""

from __future__ import annotations

import pytest

from rsc.events.commands import ChangeShardCount, CreateStream, RegisterGroup, RetireShards, StreamCommand
from rsc.events.errors import AggregateNotFound, InvalidCommand
from rsc.events.model import ShardState, StartFrom
from rsc.events.stream import StreamState, decide, fold


def run(state: StreamState | None, *commands: StreamCommand) -> StreamState:
    for command in commands:
        state = fold(decide(state, command), state)
    assert state is not None
    return state


def test_create_gives_active_shards_with_distinct_keys() -> None:
    s = run(None, CreateStream("orders", 4))
    assert s.layout.metadata_version == 1
    assert [sh.index for sh in s.layout.active] == [0, 1, 2, 3]
    keys = [sh.key for sh in s.layout.shards]
    assert len(set(keys)) == 4
    assert all(k.startswith("orders:") and "{" in k for k in keys)
    assert decide(s, CreateStream("orders", 4)) == []


def test_scale_out_appends_shards_and_bumps_version_once() -> None:
    s = run(None, CreateStream("orders", 4), ChangeShardCount(8))
    assert s.layout.metadata_version == 2
    assert s.shard_count == 8
    assert decide(s, ChangeShardCount(8)) == []


def test_scale_in_drains_the_highest_shards_then_retires_them() -> None:
    s = run(None, CreateStream("orders", 4), ChangeShardCount(2))
    assert s.shard_count == 2
    assert {sh.index for sh in s.layout.shards if sh.state is ShardState.DRAINING} == {2, 3}
    assert s.layout.readable_indexes == {0, 1, 2, 3}
    with pytest.raises(InvalidCommand):
        decide(s, RetireShards(frozenset({0})))
    s = run(s, RetireShards(frozenset({2, 3})))
    assert s.layout.readable_indexes == {0, 1}
    assert s.layout.metadata_version == 3
    s = run(s, ChangeShardCount(3))
    assert [sh.index for sh in s.layout.active] == [0, 1, 4]  # indexes are never reused


def test_scale_in_to_zero() -> None:
    s = run(None, CreateStream("orders", 3), ChangeShardCount(0))
    assert s.shard_count == 0
    assert len(s.layout.readable_indexes) == 3


@pytest.mark.parametrize(
    "command",
    [
        CreateStream("bad{name}", 1),
        CreateStream("orders", 0),
        CreateStream("orders", 20_000),
        CreateStream("", 1),
    ],
)
def test_bad_creation_is_refused(command: CreateStream) -> None:
    with pytest.raises(InvalidCommand):
        decide(None, command)


def test_commands_need_a_stream_and_groups_register_once() -> None:
    with pytest.raises(AggregateNotFound):
        decide(None, ChangeShardCount(3))
    s = run(None, CreateStream("orders", 1), RegisterGroup("billing"))
    assert s.groups == {"billing": StartFrom.EARLIEST}
    assert decide(s, RegisterGroup("billing")) == []

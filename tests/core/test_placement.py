"""Shard key placement: Redis Cluster's slot function, and new shards spread evenly over primaries."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot as redis_py_key_slot

from rsc.events.commands import ChangeShardCount, CreateStream
from rsc.events.placement import place, shard_key
from rsc.events.slots import SLOTS, Primary, Topology, crc16, key_slot
from rsc.events.stream import StreamState, decide, fold


def evenly(primaries: int) -> Topology:
    """A cluster sliced as `redis-cli --cluster create` slices it."""
    bounds = [round(i * SLOTS / primaries) for i in range(primaries + 1)]
    return Topology(
        tuple(Primary(f"10.0.0.{i}:6379", ((bounds[i], bounds[i + 1] - 1),)) for i in range(primaries))
    )


def spread(topology: Topology, keys: list[str]) -> int:
    counts = topology.count(keys).values()
    return max(counts) - min(counts)


def test_crc16_and_key_slot_match_redis() -> None:
    assert crc16(b"123456789") == 0x31C3  # the check value of CRC-16/XMODEM
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("foo{}{bar}") == crc16(b"foo{}{bar}") % SLOTS  # empty tag: the whole key
    assert key_slot("foo{{bar}}zap") == crc16(b"{bar") % SLOTS
    assert key_slot("foo{bar}{zap}") == crc16(b"bar") % SLOTS
    rng = random.Random(7)
    for _ in range(2_000):
        key = "".join(rng.choice("ab{}:-0") for _ in range(rng.randint(0, 12)))
        assert key_slot(key) == redis_py_key_slot(key.encode()), key


def test_without_a_topology_shards_keep_the_plain_names() -> None:
    assert place("orders", [0, 1], [], None) == ["orders:{orders:0}", "orders:{orders:1}"]
    assert shard_key("orders", 3, 2) == "orders:{orders:3:2}"


@pytest.mark.parametrize("primaries", [1, 2, 3, 5, 8])
def test_creation_and_each_scale_out_keep_primaries_within_one_shard(primaries: int) -> None:
    topology = evenly(primaries)
    for created in range(1, 40):
        keys = place("orders", range(created), [], topology)
        assert spread(topology, keys) <= 1, (primaries, created)
        assert len(set(keys)) == created
    keys = place("orders", range(4), [], topology)
    for target in (8, 16, 17, 64):
        keys += place("orders", range(len(keys), target), keys, topology)
        assert spread(topology, keys) <= 1, (primaries, target)
        assert all(topology.node_of(k) is not None for k in keys)


def test_the_stream_aggregate_names_shards_with_the_topology_of_its_command() -> None:
    topology = evenly(3)
    state = fold(decide(None, CreateStream("orders", 4, 0, topology)))
    assert isinstance(state, StreamState)
    state = fold(decide(state, ChangeShardCount(8, topology=topology)), state)
    assert isinstance(state, StreamState)
    keys = [s.key for s in state.layout.active]
    assert sorted(topology.count(keys).values()) == [2, 3, 3]
    assert keys[0] == "orders:{orders:0}"  # the plain name whenever its slot is on an emptiest primary


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    """Any slicing of the slots over 1-6 primaries, a primary possibly holding several ranges."""
    cuts = sorted(draw(st.sets(st.integers(1, SLOTS - 1), min_size=0, max_size=11)))
    bounds = [0, *cuts, SLOTS]
    ranges = [(bounds[i], bounds[i + 1] - 1) for i in range(len(bounds) - 1)]
    count = draw(st.integers(1, min(6, len(ranges))))
    owners = [i % count for i in range(len(ranges))]
    owners = draw(st.permutations(owners))
    return Topology(
        tuple(
            Primary(f"n{p}:6379", tuple(r for r, o in zip(ranges, owners, strict=True) if o == p))
            for p in range(count)
        )
    )


@settings(max_examples=60, deadline=None)
@given(topologies(), st.lists(st.integers(1, 12), min_size=1, max_size=5))
def test_any_slicing_stays_balanced_through_any_scale_outs(topology: Topology, steps: list[int]) -> None:
    keys: list[str] = []
    for step in steps:
        new = place("s", range(len(keys), len(keys) + step), keys, topology)
        assert len(new) == step
        keys += new
        assert spread(topology, keys) <= 1
    assert len(set(keys)) == len(keys)
    # scale-in drains the highest shards: what stays ACTIVE is a prefix, balanced as well
    assert all(spread(topology, keys[:k]) <= 1 for k in range(1, len(keys) + 1))

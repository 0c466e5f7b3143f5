"""Routing protocol jump-v1: the documented vectors, determinism, and the movement property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsc.conformance import vectors
from rsc.events.model import Layout, Shard, ShardState
from rsc.events.routing import bucket_of, jump, key_hash, route

#: The test vectors of docs/routing.md: key -> bucket for 1, 2, 3, 4, 8, 16, 100 and 1000 active shards.
VECTORS = {
    b"": (0xE3B0C44298FC1C14, [0, 1, 2, 2, 5, 5, 22, 22]),
    b"a": (0xCA978112CA1BBDCA, [0, 1, 1, 1, 1, 1, 50, 912]),
    b"order-42": (0x3BF8B157C4238EEF, [0, 1, 2, 2, 2, 2, 63, 300]),
    b"customer:1001": (0x7E1829D071507F91, [0, 0, 2, 2, 2, 12, 74, 831]),
    "Grüße".encode(): (0xF83E039796C6453A, [0, 1, 2, 3, 3, 9, 34, 973]),
}
COUNTS = (1, 2, 3, 4, 8, 16, 100, 1000)


@pytest.mark.parametrize("key", list(VECTORS), ids=repr)
def test_documented_vectors(key: bytes) -> None:
    h, buckets = VECTORS[key]
    assert key_hash(key) == h
    assert [bucket_of(key, n) for n in COUNTS] == buckets


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=5_000))
def test_a_bucket_is_always_in_range(key: bytes, n: int) -> None:
    assert 0 <= bucket_of(key, n) < n


def test_going_from_n_to_n_plus_1_moves_keys_only_to_the_new_shard_and_about_1_over_n_plus_1() -> None:
    hashes = [key_hash(f"key-{i}".encode()) for i in range(2_000)]
    before = [jump(h, 1) for h in hashes]
    for n in range(1, 257):
        after = [jump(h, n + 1) for h in hashes]
        moved = [a for b, a in zip(before, after, strict=True) if a != b]
        assert all(a == n for a in moved), f"{n} -> {n + 1}: a key moved between old shards"
        p = 1 / (n + 1)
        sigma = math.sqrt(p * (1 - p) / len(hashes))
        assert abs(len(moved) / len(hashes) - p) < 5 * sigma + 1e-9, f"{n} -> {n + 1}: {len(moved)} moved"
        before = after


def test_route_uses_active_shards_in_index_order() -> None:
    layout = Layout(
        4,
        (
            Shard(0, "k0", ShardState.RETIRED),
            Shard(1, "k1"),
            Shard(2, "k2", ShardState.DRAINING),
            Shard(3, "k3"),
            Shard(4, "k4"),
        ),
    )
    for key in VECTORS:
        assert route(layout, key) == layout.active[bucket_of(key, 3)]
    with pytest.raises(ValueError, match="no ACTIVE"):
        route(Layout(5, (Shard(0, "k0", ShardState.DRAINING),)), b"x")
    with pytest.raises(ValueError, match="routing protocol"):
        route(Layout(1, (Shard(0, "k0"),), routing="mod-v0"), b"x")


def test_the_shared_vector_file_is_what_the_code_computes() -> None:
    """rsc/conformance/vectors/jump-v1.json (what clients in other languages test against) is
    written from this code: `python -m rsc.conformance.vectors` after a change."""
    shipped = vectors.load()
    assert shipped == vectors.build()
    assert shipped["protocol"] == "jump-v1"


def test_the_shared_vectors_hold_the_documented_ones() -> None:
    shipped = {bytes.fromhex(v["keyHex"]): v for v in vectors.load()["vectors"]}
    counts = vectors.load()["counts"]
    for key, (h, buckets) in VECTORS.items():
        assert int(shipped[key]["hash"], 16) == h
        by_count = dict(zip(counts, shipped[key]["buckets"], strict=True))
        assert [by_count[n] for n in COUNTS] == buckets

"""Properties of the sticky balanced assignor."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsc.events.assignor import assign, minimal_moves, moves

member_sets = st.frozensets(st.text("abcdefgh", min_size=1, max_size=3), max_size=12)
shard_sets = st.frozensets(st.integers(0, 80), max_size=80)


@st.composite
def previous_targets(draw: st.DrawFn) -> tuple[frozenset[str], frozenset[int], dict[str, frozenset[int]]]:
    """Members, shards, and a previous target that came from the assignor itself."""
    old_members = draw(member_sets)
    old_shards = draw(shard_sets)
    previous = assign(old_members, old_shards, {})
    return draw(member_sets), draw(shard_sets), previous


def sizes(target: dict[str, frozenset[int]]) -> list[int]:
    return [len(s) for s in target.values()]


@given(previous_targets())
def test_balanced_partition_of_every_shard(case: tuple[frozenset[str], frozenset[int], dict]) -> None:
    members, shards, previous = case
    target = assign(members, shards, previous)
    assert set(target) == set(members)
    flat = [s for t in target.values() for s in t]
    assert len(flat) == len(set(flat))
    assert set(flat) == (set(shards) if members else set())
    if members:
        assert max(sizes(target)) - min(sizes(target)) <= 1


@given(previous_targets())
def test_deterministic_whatever_the_input_order(case: tuple[frozenset[str], frozenset[int], dict]) -> None:
    members, shards, previous = case
    forward = assign(sorted(members), sorted(shards), previous)
    backward = assign(
        sorted(members, reverse=True), sorted(shards, reverse=True), dict(reversed(previous.items()))
    )
    assert forward == backward


@given(previous_targets())
def test_moves_are_minimal(case: tuple[frozenset[str], frozenset[int], dict]) -> None:
    members, shards, previous = case
    target = assign(members, shards, previous)
    assert moves(previous, target) == minimal_moves(members, shards, previous)


@given(st.frozensets(st.text("abcdef", min_size=1, max_size=2), min_size=1, max_size=10), st.data())
def test_join_takes_only_from_members_above_the_new_quota(
    members: frozenset[str], data: st.DataObject
) -> None:
    shards = range(data.draw(st.integers(0, 60)))
    before = assign(members, shards, {})
    joiner = data.draw(st.text("xyz", min_size=1, max_size=2))
    after = assign(members | {joiner}, shards, before)
    quota = -(-len(shards) // (len(members) + 1))  # ceil
    for member in members:
        assert after[member] <= before[member]  # nobody already there gains
        if before[member] != after[member]:
            assert len(before[member]) >= quota
            assert len(after[member]) >= quota - 1


@given(st.frozensets(st.text("abcdef", min_size=1, max_size=2), min_size=2, max_size=10), st.data())
def test_leave_moves_only_the_leavers_shards(members: frozenset[str], data: st.DataObject) -> None:
    shards = range(data.draw(st.integers(0, 60)))
    before = assign(members, shards, {})
    leaver = data.draw(st.sampled_from(sorted(members)))
    after = assign(members - {leaver}, shards, before)
    for member in members - {leaver}:
        assert before[member] <= after[member]


@given(st.frozensets(st.text("abcdef", min_size=1, max_size=2), min_size=1, max_size=10), st.data())
def test_shard_count_change_moves_only_what_balance_needs(
    members: frozenset[str], data: st.DataObject
) -> None:
    old = data.draw(st.integers(0, 60))
    new = data.draw(st.integers(0, 60))
    before = assign(members, range(old), {})
    after = assign(members, range(new), before)
    assert moves(before, after) == minimal_moves(members, range(new), before)
    if new >= old:
        # scale-out: everyone keeps all it had unless it is above the new quota
        quota = -(-new // len(members))
        for member in members:
            assert before[member] <= after[member] or len(before[member]) >= quota


def test_extra_slot_may_stay_with_any_member() -> None:
    """KAFKA-18688: with 7 shards over 3 members, whoever holds 3 keeps them."""
    previous = {"a": frozenset({0, 1}), "b": frozenset({2, 3}), "c": frozenset({4, 5, 6})}
    target = assign("abc", range(7), previous)
    assert target == previous


def test_no_members_no_assignment() -> None:
    assert assign([], range(5), {"a": frozenset({1})}) == {}
    assert minimal_moves([], range(5), {}) == 0


@given(st.integers(2, 8), st.integers(0, 40), st.data())
def test_a_member_that_rejoins_gets_what_it_remembers_without_an_extra_move(
    n: int, s: int, data: st.DataObject
) -> None:
    """A member leaves (its shards spread over the others) and rejoins with what it remembers:
    the moves are still the fewest balance needs, what it gets is what it had as far as its
    quota goes, and when the shards divide evenly everyone is back where they were."""
    members = [f"m{i}" for i in range(n)]
    before = assign(members, range(s), {})
    x = data.draw(st.sampled_from(members))
    without = assign([m for m in members if m != x], range(s), before)
    again = assign(members, range(s), without, {x: before[x]})
    assert moves(without, again) == minimal_moves(members, range(s), without)
    assert len(again[x] & before[x]) == min(len(again[x]), len(before[x]))
    if s % n == 0:
        assert again == before
    sizes = [len(v) for v in again.values()]
    assert max(sizes) - min(sizes) <= 1

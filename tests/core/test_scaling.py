"""What a group wants for an autoscaler (pure): never more members than shards, idle shards no
work, an unknown lag busy (and the group's lag null, never 0), a paused group no more."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsc.events.scaling import ShardWork, scale

WORK = st.builds(ShardWork, st.one_of(st.none(), st.integers(0, 10**9)), st.integers(0, 10**6))


def test_busy_shards_want_a_member_each_and_idle_ones_none() -> None:
    works = [ShardWork(5, 0), ShardWork(0, 2), ShardWork(0, 0), ShardWork(0, 0)]
    found = scale(works, members=1, paused=False, members_per_replica=2)
    assert (found.lag, found.pending, found.shards, found.desired_members, found.desired_replicas) == (
        5,
        2,
        4,
        2,
        1,
    )
    assert scale([ShardWork(0, 0)] * 4, members=3, paused=False).desired_members == 0  # to zero: idle


def test_an_unknown_lag_is_null_and_busy() -> None:
    found = scale([ShardWork(None, 0), ShardWork(0, 0)], members=0, paused=False)
    assert found.lag is None
    assert found.desired_members == 1


@given(st.lists(WORK, max_size=40), st.integers(0, 50), st.booleans(), st.integers(1, 8))
def test_never_more_than_the_shards_and_a_paused_group_no_more_than_it_has(
    works: list[ShardWork], members: int, paused: bool, per_replica: int
) -> None:
    found = scale(works, members, paused, per_replica)
    assert 0 <= found.desired_members <= len(works)
    assert found.desired_replicas * per_replica >= found.desired_members
    assert (found.desired_replicas - 1) * per_replica < found.desired_members or found.desired_replicas == 0
    if paused:
        assert found.desired_members <= members
    if any(w.lag is None for w in works):
        assert found.lag is None
        assert found.desired_members >= 1 or (paused and members == 0)

"""The lease table beside a group's state (`rsc.events.liveness.Leases`)."""

from __future__ import annotations

from rsc.events.events import MemberHeartbeated
from rsc.events.liveness import Leases
from rsc.events.model import DrainProgress


def test_a_snapshot_keeps_the_table_as_it_was_while_the_table_moves_on() -> None:
    """A view rendered beside the event loop reads a snapshot: the actor's later heartbeats
    (deadlines, owned shards, drain reports) change the table, never the snapshot."""
    leases = Leases()
    leases.apply([MemberHeartbeated("a", 1_000, (DrainProgress(1, 5, 2),), frozenset({1}))])
    snapshot = leases.snapshot()
    leases.apply(
        [
            MemberHeartbeated("a", 2_000, (), frozenset({1, 2})),
            MemberHeartbeated("b", 3_000, (), frozenset({3})),
        ]
    )
    assert dict(snapshot) == {"a": 1_000}
    assert snapshot.owned("a") == {1}
    assert snapshot.drain_progress("a") == (DrainProgress(1, 5, 2),)
    assert dict(leases) == {"a": 2_000, "b": 3_000}
    assert leases.owned("a") == {1, 2}
    assert leases.drain_progress("a") == ()

"""The routing state both producers share (pure): layout switches, memo of routes, pause flags."""

from __future__ import annotations

import attrs
import pytest

from rsc.client import producer_state
from rsc.client.errors import RscError
from rsc.client.producer_state import ProducerState, UnsupportedRouting
from rsc.events import codec
from rsc.events.model import ClientInfo, HeartbeatStatus, Layout, Shard, ShardState
from rsc.events.placement import shard_key
from rsc.events.routing import route
from rsc.events.wire import ProducerHeartbeatResponse


def layout(version: int, shards: int, draining: int = 0) -> Layout:
    states = [ShardState.ACTIVE] * shards + [ShardState.DRAINING] * draining
    return Layout(version, tuple(Shard(i, shard_key("s", i), st) for i, st in enumerate(states)))


def answer(lay: Layout | None, paused: bool = False) -> ProducerHeartbeatResponse:
    version = lay.metadata_version if lay else 1
    return ProducerHeartbeatResponse(
        HeartbeatStatus.OK, "p", version, "jump-v1", 0, paused, 1_000, 5_000, lay
    )


def test_routes_follow_each_new_layout_and_never_a_stale_memo() -> None:
    state = ProducerState("s", "p", ClientInfo())
    with pytest.raises(RscError, match="no ACTIVE shard"):
        state.shard_key("k")
    v1, v2 = layout(1, 4), layout(2, 8)
    assert state.apply(answer(v1)).layout
    keys = [f"customer-{n}" for n in range(300)]
    assert [state.shard_key(k) for k in keys] == [route(v1, k.encode()).key for k in keys]
    assert [state.shard_key(k.encode()) for k in keys] == [route(v1, k.encode()).key for k in keys]
    assert not state.apply(answer(None)).layout  # no layout sent: the same version
    assert state.apply(answer(v2)).layout
    assert [state.shard_key(k) for k in keys] == [route(v2, k.encode()).key for k in keys]
    assert state.interval_s == 1.0
    assert state.request().metadata_version == 2


def test_keyless_round_robin_skips_draining_shards_and_the_memo_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = ProducerState("s", "p", ClientInfo())
    state.apply(answer(layout(1, 3, draining=2)))
    assert [state.shard_key(None) for _ in range(6)] == [shard_key("s", i) for i in (0, 1, 2, 0, 1, 2)]
    monkeypatch.setattr(producer_state, "ROUTE_CACHE", 10)
    for n in range(25):
        assert state.shard_key(f"k{n}") == route(state.layout, b"k%d" % n).key
    assert len(state._routes) <= 10


def test_pause_and_resume_are_reported_once_and_quiesced_needs_idle() -> None:
    state = ProducerState("s", "p", ClientInfo())
    state.apply(answer(layout(1, 2)))
    change = state.apply(answer(None, paused=True))
    assert change.paused
    assert not change.resumed
    assert not state.apply(answer(None, paused=True)).paused  # no news
    state.in_flight = 1
    assert not state.request().quiesced
    state.in_flight = 0
    assert state.request().quiesced
    assert state.apply(answer(None)).resumed
    assert not state.request().quiesced
    assert state.request(leave=True).leave


def test_a_routing_protocol_it_does_not_know_stops_publishing_instead_of_misrouting() -> None:
    state = ProducerState("s", "p", ClientInfo())
    state.apply(answer(layout(1, 4)))
    future = attrs.evolve(layout(2, 8), routing="ring-v2")
    assert not state.apply(answer(future)).layout
    with pytest.raises(UnsupportedRouting, match="ring-v2"):
        state.shard_key("k")
    with pytest.raises(UnsupportedRouting):
        state.shard_key(None)
    assert state.request().metadata_version == 1  # it still routes (acknowledges) nothing newer
    state.apply(answer(layout(3, 8)))  # back to jump-v1 (a rollback of the coordinator)
    assert state.shard_key("k") == route(state.layout, b"k").key


def test_full_shards_are_reported_early_at_most_every_gap_and_once_sent_forgotten() -> None:
    state = ProducerState("s", "p", ClientInfo())
    state.apply(answer(layout(1, 4)))
    assert "fullShards" not in codec.wire.unstructure(state.request())  # an N-1 coordinator's shape
    assert state.note_full([shard_key("s", 2), "not-a-shard-of-the-layout"], now_s=10.0)
    assert not state.note_full([shard_key("s", 3)], now_s=10.0 + producer_state.FULL_REPORT_GAP_S / 2)
    request = state.request()
    assert request.full_shards == {2, 3}
    assert sorted(codec.wire.unstructure(request)["fullShards"]) == [2, 3]
    state.note_full([shard_key("s", 1)], now_s=10.1)  # while that heartbeat is on its way
    state.sent(request)
    assert state.request().full_shards == {1}  # reported: only the newer one is left
    assert state.note_full([shard_key("s", 1)], now_s=10.0 + producer_state.FULL_REPORT_GAP_S)
    state.sent(state.request())
    assert not state.note_full([], now_s=99.0)  # nothing to report: no early heartbeat

"""The rules of a heartbeat at the coordinator's edge (`rsc.events.heartbeat_rules`), pure: what
it may create or rebuild, what is rate limited and under which key, the shape of its answer."""

from __future__ import annotations

import hypothesis
import pytest
from hypothesis import strategies as st

from rsc.events import auth, codec, heartbeat_rules, quotas
from rsc.events.commands import Heartbeat
from rsc.events.errors import InvalidCommand, UnsupportedProtocolVersion
from rsc.events.model import FenceReason, HeartbeatStatus
from rsc.events.versions import PROTOCOL_VERSION
from rsc.events.wire import (
    HeartbeatRequest,
    HeartbeatResponse,
    ProducerHeartbeatRequest,
    ProducerHeartbeatResponse,
    ShardAssignment,
)

WORKERS = auth.credential("workers", ["member"], token="w" * 20)
SHOP = auth.credential("shop", ["producer"], token="s" * 20)


def member(epoch: int, version: int = 7) -> HeartbeatRequest:
    return HeartbeatRequest(2, "orders", "billing", "m-1", "i-1", epoch, version)


def producer(version: int = 7, leave: bool = False) -> ProducerHeartbeatRequest:
    return ProducerHeartbeatRequest(2, "orders", "p-1", version, leave=leave)


@pytest.mark.parametrize(
    ("epoch", "auto", "may_create", "creates"),
    [
        (0, True, True, True),  # a join, where groups are made and the caller may make them
        (0, False, True, False),  # groups are not created automatically
        (0, True, False, False),  # the caller may not create
        (3, True, True, False),  # a member already in its group speaks of one it was in
        (-1, True, True, False),  # a leave never creates
    ],
)
def test_only_a_join_may_create_a_group(epoch: int, auto: bool, may_create: bool, creates: bool) -> None:
    assert heartbeat_rules.creates_group(member(epoch), auto, may_create) is creates


@pytest.mark.parametrize(
    ("epoch", "may_create", "seen"),
    [(3, True, 7), (3, False, 0), (0, True, 0), (-1, True, 0)],
)
def test_only_a_member_in_its_group_that_may_create_tells_a_version(
    epoch: int, may_create: bool, seen: int
) -> None:
    assert heartbeat_rules.seen_version(member(epoch), may_create) == seen


def test_a_producer_leaves_creation_to_the_deployment_unless_it_may_not_create() -> None:
    assert heartbeat_rules.producer_creates(True) is None
    assert heartbeat_rules.producer_creates(False) is False
    assert heartbeat_rules.producer_seen_version(producer(7), True) == 7
    assert heartbeat_rules.producer_seen_version(producer(7), False) == 0


def test_a_join_carries_the_members_quota_and_nothing_else_does() -> None:
    join = Heartbeat("m-1", "i-1", 0, 1_000)
    assert heartbeat_rules.with_join_quota(join, 5).max_members == 5
    again = Heartbeat("m-1", "i-1", 4, 1_000, metadata_version=7)
    assert heartbeat_rules.with_join_quota(again, 5) is again


def test_a_leave_is_never_rate_limited() -> None:
    assert heartbeat_rules.limited(member(3))
    assert heartbeat_rules.limited(member(0))
    assert not heartbeat_rules.limited(member(-1))
    assert heartbeat_rules.producer_limited(producer())
    assert not heartbeat_rules.producer_limited(producer(leave=True))


def test_a_batch_costs_one_token_an_item_its_leaves_free() -> None:
    items = [{"memberEpoch": 0}, {"memberEpoch": -1}, {"memberEpoch": 5}, {}]
    assert heartbeat_rules.batch_cost(items) == 3
    assert heartbeat_rules.batch_cost([{"memberEpoch": -1}]) == 0
    assert heartbeat_rules.batch_cost([]) == 0


def test_a_partys_key_is_its_names_and_the_credential_that_speaks_for_it() -> None:
    assert heartbeat_rules.member_key(WORKERS, member(3)) == "workers\norders\nbilling\nm-1\ni-1"
    anonymous = heartbeat_rules.member_key(None, member(3))
    assert anonymous.split("\n")[0] == quotas.ANONYMOUS
    # Another incarnation under the same member id spends its own tokens.
    assert heartbeat_rules.member_key(WORKERS, member(3)) != heartbeat_rules.member_key(
        WORKERS, HeartbeatRequest(2, "orders", "billing", "m-1", "i-2", 3)
    )
    assert heartbeat_rules.producer_key(SHOP, producer()) == "shop\norders\np-1"
    assert heartbeat_rules.producer_key(None, producer()) == f"{quotas.ANONYMOUS}\norders\np-1"


def acking(epoch: int, *shards: int) -> HeartbeatRequest:
    return HeartbeatRequest(2, "orders", "billing", "m-1", "i-1", epoch, 7, revoked_shards=frozenset(shards))


def test_protocol_work_is_not_charged_to_a_members_own_limit() -> None:
    def charge(body: HeartbeatRequest, last: heartbeat_rules.Acknowledged | None) -> str:
        return heartbeat_rules.member_charge(body, True, last)

    assert charge(member(-1), None) == heartbeat_rules.CHARGE_NONE  # a leave
    assert heartbeat_rules.member_charge(member(-1), False, None) == heartbeat_rules.CHARGE_NONE
    # The first join of an incarnation: to its member id's joins; a rejoin: to its own limit.
    assert heartbeat_rules.member_charge(member(0), False, None) == heartbeat_rules.CHARGE_JOIN
    assert charge(member(0), None) == heartbeat_rules.CHARGE_PARTY
    assert charge(member(5), None) == heartbeat_rules.CHARGE_PARTY  # nothing new
    assert charge(acking(5, 1), None) == heartbeat_rules.CHARGE_NONE  # news of a revoke
    assert charge(acking(5, 1), (5, frozenset({1}))) == heartbeat_rules.CHARGE_PARTY  # an echo
    assert charge(acking(5, 1), (6, frozenset({2}))) == heartbeat_rules.CHARGE_PARTY  # older epoch
    assert charge(acking(6, 1), (5, frozenset({1}))) == heartbeat_rules.CHARGE_NONE  # newer epoch


def test_what_a_member_acknowledged_grows_at_one_epoch_and_restarts_at_a_newer_one() -> None:
    news = heartbeat_rules.acknowledges_news
    assert news(acking(5, 1, 2), None) == (5, frozenset({1, 2}))
    assert news(acking(5, 2, 3), (5, frozenset({1, 2}))) == (5, frozenset({1, 2, 3}))
    assert news(acking(5, 2), (5, frozenset({1, 2}))) is None  # part of what it acknowledged
    assert news(acking(7, 2), (5, frozenset({1, 2}))) == (7, frozenset({2}))
    assert news(member(5), None) is None
    assert news(acking(0, 1), None) is None  # a join acknowledges nothing


@hypothesis.given(
    st.lists(
        st.tuples(st.integers(1, 4), st.frozensets(st.integers(0, 5), min_size=1, max_size=3)),
        max_size=60,
    )
)
def test_free_acknowledgements_are_bounded_however_a_client_alternates(
    acks: list[tuple[int, frozenset[int]]],
) -> None:
    """A client cannot loop for free: at one epoch at most one free heartbeat per shard it
    names, and epochs never go back (4 epochs x 6 shards here)."""
    last: heartbeat_rules.Acknowledged | None = None
    free = 0
    for epoch, shards in acks:
        body = acking(epoch, *shards)
        news = heartbeat_rules.acknowledges_news(body, last)
        if news is not None:
            free += 1
            last = news
    assert free <= 4 * 6


def test_a_join_limit_is_keyed_by_member_id_without_the_incarnation() -> None:
    one = heartbeat_rules.member_key_suffix(member(0))
    other = heartbeat_rules.member_key_suffix(HeartbeatRequest(2, "orders", "billing", "m-1", "i-2", 0))
    assert one != other
    assert heartbeat_rules.join_key_suffix(one) == heartbeat_rules.join_key_suffix(other)
    assert heartbeat_rules.join_key_suffix(one) == "orders\nbilling\nm-1"


@pytest.mark.parametrize(
    "body",
    [
        HeartbeatRequest(2, "orders\nx", "billing", "m-1", "i-1", 3),  # a key's separator
        HeartbeatRequest(2, "orders", "", "m-1", "i-1", 3),
        HeartbeatRequest(2, "orders", "billing", "", "i-1", 3),
        HeartbeatRequest(2, "orders", "billing", "m-1", "i\u00e9", 3),
    ],
)
def test_a_key_is_made_of_checked_names_only(body: HeartbeatRequest) -> None:
    with pytest.raises(InvalidCommand):
        heartbeat_rules.member_key(WORKERS, body)


def test_an_answer_takes_the_shape_of_the_version_it_answers() -> None:
    response = ProducerHeartbeatResponse(HeartbeatStatus.OK, "p-1", 7, "jump-v1", 4, False, 1_000, 5_000)
    assert heartbeat_rules.answered_in(response, 1, 3) is response  # exactly version 1's shape
    answered = heartbeat_rules.answered_in(response, 2, 3)
    assert (answered.protocol_version, answered.feature_level) == (2, 3)
    newer = heartbeat_rules.answered_in(response, PROTOCOL_VERSION + 5, 3)
    assert newer.protocol_version == PROTOCOL_VERSION  # a newer one is answered in the newest
    with pytest.raises(UnsupportedProtocolVersion):
        heartbeat_rules.answered_in(response, 0, 3)


def test_only_a_caller_that_sees_every_stream_may_read_names_on_a_public_path() -> None:
    monitor = auth.credential("grafana", ["monitor"], token="g" * 20, streams=["orders"])
    everything = auth.credential("ops", ["monitor"], token="o" * 20)
    open_views = auth.policy([monitor, everything])
    assert auth.sees_every_stream(open_views, None, auth.Action.VIEW)  # public views: as anyone
    assert auth.sees_every_stream(open_views, monitor, auth.Action.VIEW)  # never less than anyone
    protected = auth.policy([monitor, everything], protect_views=True)
    assert not auth.sees_every_stream(protected, None, auth.Action.VIEW)
    assert not auth.sees_every_stream(protected, monitor, auth.Action.VIEW)
    assert auth.sees_every_stream(protected, everything, auth.Action.VIEW)
    assert auth.sees_every_stream(protected, auth.ADMIN, auth.Action.VIEW)


@hypothesis.given(
    static=st.sampled_from([None, True]),
    revoke_timeout_ms=st.sampled_from([None, 0, 60_000]),
    fence_reason=st.sampled_from([None, *FenceReason]),
    requested=st.integers(min_value=1, max_value=PROTOCOL_VERSION + 3),
    level=st.integers(min_value=1, max_value=9),
)
def test_an_answer_rendered_at_once_is_the_answer_in_its_version(
    static: bool | None,
    revoke_timeout_ms: int | None,
    fence_reason: FenceReason | None,
    requested: int,
    level: int,
) -> None:
    response = HeartbeatResponse(
        HeartbeatStatus.OK,
        3,
        4,
        4,
        3_000,
        10_000,
        2,
        ShardAssignment((0, 1), (2,), (3,)),
        1,
        fence_reason=fence_reason,
        static=static,
        revoke_timeout_ms=revoke_timeout_ms,
    )
    expected = codec.wire.unstructure(heartbeat_rules.answered_in(response, requested, level))
    rendered = heartbeat_rules.answered_json(response, requested, level)
    assert rendered == expected
    assert list(rendered) == list(expected)  # the same fields in the same order
    with pytest.raises(UnsupportedProtocolVersion):
        heartbeat_rules.answered_json(response, 0, level)

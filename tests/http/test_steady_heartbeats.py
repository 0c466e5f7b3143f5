"""Steady heartbeats parsed and answered once (`rsc.http.heartbeats.steady`): the memo changes
no answer. The same scenario of batches goes to a coordinator with the memo and to one without
it, and every answer must agree; refusals, authorization and rate limits still apply to an item
its member sent before; and the memo's own rules, on their own."""

from __future__ import annotations

import gc
import json
from typing import Any, ClassVar

import attrs
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsc.events.auth import credential
from rsc.events.model import MAX_COUNTER
from rsc.events.wire import HeartbeatRequest
from rsc.http.heartbeats import routes as heartbeat_routes
from rsc.http.heartbeats import steady as steady_heartbeats
from rsc.http.heartbeats.steady import SteadyHeartbeats
from rsc.http.json_io import structure
from tests.httpkit import FAST, beat, hb, serve_on, workers_and_others

TOKEN = "steady-member-token-0123456789"
OTHER = "steady-other-token-0123456789"
MORE = "steady-more-token-0123456789"


class _Recorded(SteadyHeartbeats):
    """The memo, each made kept in `made` (to read its counts)."""

    made: ClassVar[list[SteadyHeartbeats]] = []

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(limit)
        _Recorded.made.append(self)


def _same(answers: list[Any], prefix: str) -> list[Any]:
    """Answers with the stream's name and the request ids left out (they differ per run)."""
    out = []
    for answer in answers:
        for item in answer.get("responses", [answer]):
            item.pop("requestId", None)
        out.append(httpx.Response(200, content=str(answer).replace(prefix, "<stream>")).text)
    return out


async def _scenario(http: httpx.AsyncClient, prefix: str) -> list[Any]:
    """Members join, beat steadily, see the group change under them, change their own items,
    send invalid ones and stale ones; every answer, in order."""
    seen: list[Any] = []

    async def batch(*items: dict[str, Any]) -> None:
        response = await http.post("/v1/heartbeats", json={"heartbeats": list(items)})
        assert response.status_code == 200, response.text
        seen.append(response.json())

    def steady(member: str, epoch: int, **extra: Any) -> dict[str, Any]:
        return hb(prefix, member, epoch, protocolVersion=2, **extra)

    e1 = (await beat(http, hb(prefix, "m1", 0)))["memberEpoch"]
    e2 = (await beat(http, hb(prefix, "m2", 0)))["memberEpoch"]
    for _ in range(3):  # steady: the same items, the same state
        await batch(steady("m1", e1), steady("m2", e2))
    for _ in range(2):  # the same items in protocol version 1 (the same member slots)
        await batch(hb(prefix, "m1", e1), hb(prefix, "m2", e2))
    seen.append(await beat(http, hb(prefix, "m3", 0)))  # the group changes under them
    for _ in range(2):
        await batch(steady("m1", e1), steady("m2", e2))
    answers = seen[-1]["responses"]
    e1, e2 = answers[0]["memberEpoch"], answers[1]["memberEpoch"]
    for _ in range(2):  # they take their new epochs and report what they own
        owned = [sorted(set(a["assignment"]["assigned"]) - set(a["assignment"]["revoke"])) for a in answers]
        revoked = [sorted(a["assignment"]["revoke"]) for a in answers]
        await batch(
            steady("m1", e1, ownedShards=owned[0], revokedShards=revoked[0]),
            steady("m2", e2, ownedShards=owned[1], revokedShards=revoked[1]),
        )
        answers = seen[-1]["responses"]
    await batch(steady("m1", e1), steady("m2", e2))
    # the same member, an item that no longer fits the schema, or is the same but for the
    # type of one value (`true` is no epoch, `1.0` is one), or asks for a long poll
    await batch(steady("m1", e1), {**steady("m2", e2), "memberEpoch": True})
    await batch({**steady("m1", e1), "memberEpoch": float(e1)}, steady("m2", e2))
    await batch(steady("m1", e1, waitMs=1), steady("m2", e2))
    await batch(steady("m1", e1), steady("m2", e2, metadataVersion=99))  # ahead: SYNC_METADATA
    await batch(steady("m1", e1), steady("m2", e2))
    await batch(steady("m1", e1 + 50), steady("m2", e2))  # a stale epoch: FENCED, changes nothing
    await batch(steady("m1", e1), steady("m2", e2))
    await batch(steady("m1", e1), steady("m2", e2))
    await batch(steady("m2", e2, memberEpoch=-1), steady("m2", e2))  # leaves, then is unknown
    await batch(steady("m2", e2), steady("m2", e2))
    return seen


async def test_the_memo_changes_no_answer(
    standalone_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeat_routes, "SteadyHeartbeats", _Recorded)
    _Recorded.made.clear()
    settings = attrs.evolve(FAST, redis_url=standalone_url, revoke_timeout_ms=60_000)
    async with serve_on(settings) as http:
        remembered = await _scenario(http, prefix + "memo")
    (memo,) = _Recorded.made
    assert memo.parse_hits >= 10
    assert memo.answer_hits >= 5
    monkeypatch.setattr(steady_heartbeats, "DEFAULT_LIMIT", 0)
    async with serve_on(settings) as http:
        parsed = await _scenario(http, prefix + "none")
    assert _Recorded.made[1].parse_hits == 0
    assert _same(remembered, prefix + "memo") == _same(parsed, prefix + "none")
    answers = [a["responses"] for a in remembered if "responses" in a]
    assert [r["status"] for r in answers[-5]] == ["FENCED", "OK"]
    assert [r["status"] for r in answers[-4]] == ["OK", "OK"]
    assert [r["memberEpoch"] for r in answers[-2]] == [-1, 0]  # left, then unknown
    assert [r["status"] for r in answers[-1]] == ["UNKNOWN_MEMBER"] * 2
    assert [r["status"] for r in answers[-7]] == ["OK", "SYNC_METADATA"]
    assert [r.get("error") for r in answers[-10]] == [None, "INVALID_REQUEST"]


async def test_a_remembered_item_is_still_authorized_and_rate_limited(
    standalone_url: str, prefix: str
) -> None:
    settings = attrs.evolve(
        FAST,
        redis_url=standalone_url,
        credentials=(
            *workers_and_others(prefix, TOKEN, OTHER),
            credential("more", ["member"], token=MORE, streams=[f"{prefix}*"]),
        ),
        rate_limit_party_per_interval=1,
        rate_limit_party_burst=4,
        rate_limit_heartbeats_per_s=0,
    )
    workers = {"Authorization": f"Bearer {TOKEN}"}
    others = {"Authorization": f"Bearer {OTHER}"}
    async with serve_on(settings) as http:
        joined = await http.post("/v1/heartbeat", json=hb(prefix, "m1", 0), headers=workers)
        item = hb(prefix, "m1", joined.json()["memberEpoch"])
        codes = []
        more = {"Authorization": f"Bearer {MORE}"}
        for headers in (workers, workers, others, workers, workers, workers, workers, more):
            answer = await http.post("/v1/heartbeats", json={"heartbeats": [item]}, headers=headers)
            assert answer.status_code == 200, answer.text
            codes.append(answer.json()["responses"][0].get("error", "OK"))
    # the burst of 4 (a first join is charged to the member id's joins, not to it) runs out
    # on the fifth of the workers' batches; the other caller is refused the stream whatever the
    # memo holds, and spends no token of theirs; a third caller allowed on the stream has a
    # limit of its own for the member, memo or not
    assert codes == ["OK", "OK", "FORBIDDEN", "OK", "OK", *["RATE_LIMITED"] * 2, "OK"]


async def test_only_what_the_group_accepted_is_remembered(
    standalone_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeat_routes, "SteadyHeartbeats", _Recorded)
    _Recorded.made.clear()
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as http:
        epoch = (await beat(http, hb(prefix, "m1", 0)))["memberEpoch"]
        (memo,) = _Recorded.made
        for items in ([hb(prefix, "ghost", 5)], [hb(f"{prefix}none", "m1", 5)]):
            for _ in range(3):  # an unknown member, a group that does not exist
                answer = (await http.post("/v1/heartbeats", json={"heartbeats": items})).json()
                assert answer["responses"][0].get("status", answer["responses"][0].get("error")) in (
                    "UNKNOWN_MEMBER",
                    "GROUP_NOT_FOUND",
                )
        assert (len(memo), memo.parse_hits) == (0, 0)
        for _ in range(2):
            await http.post("/v1/heartbeats", json={"heartbeats": [hb(prefix, "m1", epoch)]})
        assert (len(memo), memo.parse_hits, memo.answer_hits) == (1, 1, 1)


def _request(epoch: int = 3) -> HeartbeatRequest:
    return HeartbeatRequest(
        protocol_version=2,
        stream_prefix="orders",
        consumer_group="billing",
        member_id="m-1",
        incarnation="i-1",
        member_epoch=epoch,
    )


def _item(epoch: Any = 3) -> dict[str, Any]:
    return {
        "protocolVersion": 2,
        "streamPrefix": "orders",
        "consumerGroup": "billing",
        "memberId": "m-1",
        "incarnation": "i-1",
        "memberEpoch": epoch,
    }


class _State:
    """A stand-in for a group state: only its identity matters to the memo."""


def test_an_item_is_found_again_only_if_it_is_the_same_json() -> None:
    memo = SteadyHeartbeats()
    slot, text, known = memo.parsed(_item())
    assert known is None
    assert slot == ("orders", "billing", "m-1")
    remembered = memo.remember(slot, text, "suffix", _request())
    assert memo.parsed(_item())[2] is remembered
    for other in (_item(True), _item(3.0), {**_item(), "ownedShards": [1]}, {**_item(), "x": 1}):
        assert memo.parsed(other)[2] is None, other
    assert memo.parsed({**_item(), "memberId": 7}) == (None, b"", None)  # names must be strings
    assert memo.parsed({**_item(), "memberEpoch": 2**70}) == (None, b"", None)  # past 64 bits
    assert memo.parse_hits == 1


def test_joins_and_leaves_are_not_remembered_and_the_memo_is_bounded() -> None:
    memo = SteadyHeartbeats(limit=4)  # two generations of two
    for epoch in (0, -1):
        slot, text, _ = memo.parsed(_item(epoch))
        assert slot is not None
        assert memo.remember(slot, text, "", _request(epoch)) is None

    def seen(member: str) -> bool:
        slot, text, known = memo.parsed({**_item(), "memberId": member})
        if known is None:
            assert slot is not None
            memo.remember(slot, text, "", _request())
        return known is not None

    assert [seen(m) for m in ("a", "b", "c")] == [False, False, False]
    assert len(memo) == 3  # a and b the older generation, c the current one
    assert seen("a")  # found in the older generation: moves to the current one
    assert not seen("d")  # the current one was full: a new one; b is forgotten
    assert [seen(m) for m in ("b", "a", "d")] == [False, True, True]
    assert len(memo) <= 4
    big = {**_item(), "ownedShards": list(range(2000))}  # over MAX_ITEM_BYTES: never remembered
    assert memo.parsed(big) == (None, b"", None)
    none = SteadyHeartbeats(limit=0)
    slot, text, _ = none.parsed(_item())
    assert slot is not None
    assert none.remember(slot, text, "", _request()) is None
    assert len(none) == 0


def test_an_answer_too_large_is_not_kept() -> None:
    memo = SteadyHeartbeats()
    slot, text, _ = memo.parsed(_item())
    assert slot is not None
    known = memo.remember(slot, text, "", _request())
    assert known is not None
    state = _State()
    large = {"layout": {"routing": list(range(2000))}}  # (an answer carrying a whole layout)
    assert json.loads(memo.keep_answer(known, state, 5, large).text) == large
    assert memo.answer(known, state, 5) is None


def test_an_answer_is_reused_only_for_the_very_same_state_and_level() -> None:
    memo = SteadyHeartbeats()
    slot, text, _ = memo.parsed(_item())
    assert slot is not None
    known = memo.remember(slot, text, "", _request())
    assert known is not None
    state, other = _State(), _State()
    assert memo.answer(known, state, 5) is None
    answer = memo.keep_answer(known, state, 5, {"status": "OK", "memberEpoch": 3})
    assert json.loads(answer.text) == {"status": "OK", "memberEpoch": 3}
    assert memo.answer(known, state, 5) is answer
    assert memo.answer(known, other, 5) is None
    assert memo.answer(known, state, 4) is None
    del state
    gc.collect()
    assert memo.answer(known, other, 5) is None  # (a state gone is never mistaken for another)
    assert memo.answer_hits == 1


def test_a_member_s_next_item_keeps_its_rate_limit_key_while_its_names_do() -> None:
    """A reconciling member sends a new epoch each time (a new item, parsed afresh), but its
    rate-limit key depends on its names only: the one remembered comes back for the same
    incarnation, and nothing for another one or another member."""
    memo = SteadyHeartbeats()
    slot, text, _ = memo.parsed(_item(3))
    assert slot is not None
    memo.remember(slot, text, "the suffix", _request())
    moved, _, known = memo.parsed(_item(4))
    assert known is None
    assert moved == slot
    assert memo.key_suffix(slot, "i-1") == "the suffix"
    assert memo.key_suffix(slot, "i-2") is None
    assert memo.key_suffix(("orders", "billing", "m-2"), "i-1") is None


def _full_item(epoch: Any = 3) -> dict[str, Any]:
    return {
        **_item(epoch),
        "metadataVersion": 2,
        "ownedShards": [4, 1],
        "revokedShards": [],
        "client": {"name": "rsc-python", "version": "0.2.0"},
        "waitMs": 0,
    }


def _remembered(memo: SteadyHeartbeats, raw: dict[str, Any]) -> tuple[str, str, str]:
    slot, text, _ = memo.parsed(raw)
    assert slot is not None
    memo.remember(slot, text, "", structure(raw, HeartbeatRequest))
    return slot


def test_an_item_that_moved_only_its_epoch_is_not_parsed_again() -> None:
    """A storm moves every member's epoch and nothing else of its item: the request comes from
    the remembered one with the new epoch, exactly what parsing it would give; any other
    difference, or an epoch that is no member's, is parsed the long way."""
    memo = SteadyHeartbeats()
    slot = _remembered(memo, _full_item(3))
    moved = _full_item(7)
    _, text, known = memo.parsed(moved)
    assert known is None
    assert memo.epoch_moved(slot, moved, text) == structure(moved, HeartbeatRequest)
    assert memo.epoch_hits == 1
    for other in (
        {**_full_item(7), "ownedShards": [4]},  # the epoch and more
        {**_full_item(7), "client": {"name": "rsc-python", "version": "0.2.0", "memberEpoch": 7}},
        _full_item(True),
        _full_item(7.0),
        _full_item(0),
        _full_item(-1),
        _full_item(2**53),  # past MAX_COUNTER
        _full_item(3),  # the same epoch: `parsed` found it (or it changed elsewhere)
    ):
        _, other_text, _ = memo.parsed(other)
        assert memo.epoch_moved(slot, other, other_text) is None, other
    assert memo.epoch_moved(("orders", "billing", "m-9"), moved, text) is None  # not remembered


@given(
    epoch=st.one_of(st.integers(-3, 2**54), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3)),
    changes=st.dictionaries(
        st.sampled_from(["ownedShards", "metadataVersion", "waitMs", "memberEpoch", "x", "client"]),
        st.one_of(
            st.integers(-2, 2**54),
            st.lists(st.integers(0, 5), max_size=3),
            st.fixed_dictionaries({"name": st.just("rsc-python"), "version": st.just("0.2.0")}),
            st.fixed_dictionaries({"memberEpoch": st.integers(0, 9)}),
        ),
        max_size=2,
    ),
)
@settings(max_examples=300)
def test_a_moved_epoch_is_what_parsing_the_item_gives(epoch: Any, changes: dict[str, Any]) -> None:
    memo = SteadyHeartbeats()
    slot = _remembered(memo, _full_item(3))
    raw = {**_full_item(epoch), **changes}
    found_slot, text, known = memo.parsed(raw)
    if found_slot is None or known is not None:
        return  # never remembered, or the very same item
    moved = memo.epoch_moved(slot, raw, text)
    if moved is None:
        return
    assert moved == structure(raw, HeartbeatRequest)
    assert 0 < moved.member_epoch <= MAX_COUNTER

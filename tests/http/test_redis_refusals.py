"""A Redis refusal reaches HTTP as a typed answer, never a bare 500 `INTERNAL`: Redis
unavailable (a transient code) is 503 `UNAVAILABLE`, `OOM` 503 `REDIS_OUT_OF_MEMORY`, and any
other refusal (`WRONGTYPE`, `NOPERM`...) 500 `REDIS_REFUSED` naming its code and, where the
refusal says, the key and its role. Every refusal class coredis has is checked, raw, inside
trio's exception groups and worded as a failed pipeline command; then a real one over a socket."""

from __future__ import annotations

import attrs
import coredis
import pytest
import redis as redis_py
from coredis.parser import Parser

from rsc.http.answers import error_answer, key_role
from rsc.redis_errors import TRANSIENT_CODES, error_code
from tests import redis_servers
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


def _refusals() -> list[tuple[str, type[BaseException]]]:
    found = []
    for code, entry in Parser.EXCEPTION_CLASSES.items():
        for kind in entry.values() if isinstance(entry, dict) else (entry,):
            found.append((code, kind))
    return found


REFUSALS = _refusals()


@pytest.mark.parametrize("shape", ["raw", "group", "pipeline"])
@pytest.mark.parametrize(("code", "kind"), REFUSALS, ids=[f"{c}-{k.__name__}" for c, k in REFUSALS])
def test_every_coredis_refusal_is_a_typed_answer(code: str, kind: type[BaseException], shape: str) -> None:
    text = "some words from Redis"
    if shape == "pipeline":
        text = f"Command # 2 (XINFO GROUPS b'orders:{{0}}') of pipeline caused error: {text}"
    if code in ("ASK", "MOVED"):  # (these parse their text: a slot and a node)
        text = "3999 127.0.0.1:6381"
        shape = "raw" if shape == "pipeline" else shape
    refusal: BaseException = kind(text)
    raised: Exception = (
        ExceptionGroup("coredis under trio", [refusal]) if shape == "group" else refusal  # type: ignore[list-item]
    )
    answer = error_answer(raised, "GET", "/v1/streams/orders")
    assert answer.code != "INTERNAL", (code, kind, answer)
    if issubclass(kind, coredis.exceptions.ConnectionError) or error_code(refusal) in TRANSIENT_CODES:
        assert (answer.status, answer.code) == (503, "UNAVAILABLE")
    elif error_code(refusal) == "OOM":
        assert (answer.status, answer.code) == (503, "REDIS_OUT_OF_MEMORY")
    elif answer.code != "UNAVAILABLE":  # (the classes coredis counts as a Redis not answering)
        assert (answer.status, answer.code) == (500, "REDIS_REFUSED")
        assert answer.details["redisCode"] == error_code(refusal)
        if shape == "pipeline":
            assert answer.details["key"] == "orders:{0}"
            assert answer.details["keyRole"] == "a shard key"


@pytest.mark.parametrize("code", ["NOPERM", "WRONGTYPE", "OOM", "MOVEDTOSOMEWHEREELSE"])
def test_a_refusal_coredis_has_no_class_for_is_told_by_its_code(code: str) -> None:
    answer = error_answer(coredis.exceptions.ResponseError(f"{code} this user has no permissions"))
    if code == "OOM":
        assert (answer.status, answer.code) == (503, "REDIS_OUT_OF_MEMORY")
    else:
        assert (answer.status, answer.code, answer.details["redisCode"]) == (500, "REDIS_REFUSED", code)
        assert code in answer.message


def test_a_key_role_is_told_by_its_name() -> None:
    assert key_role("orders:{3}") == "a shard key"
    assert key_role("orders:{3}:dlq") == "a shard's dead-letter stream"
    assert key_role("orders:{3}:rsc:v1:seal") == "a shard's seal"
    assert key_role("orders:{3}:rsc:v1:owners") == "a shard's owner tokens"
    assert key_role("orders:{3}:rsc:v1:producer:api") == "a producer's dedupe record"
    assert key_role("rsc:v1:{s/orders}:journal") == "an aggregate's journal"


async def test_a_shard_key_another_program_overwrote_is_named_in_a_500_redis_refused() -> None:
    """Something else SETs a string at a shard key: the stream view says WRONGTYPE and which key
    (it was a 503 `UNAVAILABLE`, which asks the caller to retry what never succeeds)."""
    with redis_servers.standalone() as url:
        checker = redis_py.Redis.from_url(url, decode_responses=True)
        async with serve_on(attrs.evolve(FAST, redis_url=url, admin_password="pw")) as http:
            created = await http.put("/v1/admin/streams/orders", json={"shardCount": 2}, auth=AUTH)
            assert created.status_code == 200, created.text
            key = (await http.get("/v1/streams/orders/routing", auth=AUTH)).json()["shards"][1]["key"]
            checker.delete(key)
            checker.set(key, "not a stream")
            answer = await http.get("/v1/streams/orders", auth=AUTH)
            assert answer.status_code == 500, answer.text
            body = answer.json()
            assert body["error"] == "REDIS_REFUSED"
            assert body["details"] == {"redisCode": "WRONGTYPE", "key": key, "keyRole": "a shard key"}
            assert key in body["message"]
            checker.delete(key)
            assert (await http.get("/v1/streams/orders", auth=AUTH)).status_code == 200

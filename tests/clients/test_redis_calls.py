"""The client's one Redis error boundary (`rsc.client.redis_calls.redis_call`), on every shape
of failure coredis raises: bare, or nested in the exception groups it raises under trio."""

from __future__ import annotations

import coredis
import pytest
import trio

from rsc.client.errors import Fenced, RedisCommandFailed, RedisUnavailable
from rsc.client.redis_calls import redis_call
from rsc.redis_errors import error_code, is_unavailable, reply_code

E = coredis.exceptions

UNAVAILABLE = [
    E.ConnectionError("Connection reset by peer"),
    E.ConnectionError(),  # some carry no message at all
    E.BusyLoadingError("Redis is loading the dataset in memory"),
    E.ReadOnlyError("You can't write against a read only replica."),
    E.TryAgainError("Multiple keys request during rehashing of slot"),
    E.ClusterDownError("The cluster is down"),
    E.ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    E.ResponseError("BUSY Redis is busy running a script."),
    TimeoutError(),
    ConnectionRefusedError(111, "Connection refused"),
    trio.BrokenResourceError(),
]
REFUSED = [
    # coredis strips the code of the refusals it has a class for: told by the class
    (E.StreamConsumerGroupError("No such key 'k' or consumer group 'g'"), "NOGROUP"),
    (E.AuthorizationError("this user has no permissions"), "NOPERM"),
    (E.UnblockedError("force unblock from blocking operation, instance state changed"), "UNBLOCKED"),
    (E.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), "WRONGTYPE"),
    (E.ResponseError("ERR Error running script"), "ERR"),
    (E.ResponseError("no such key"), "ERR"),  # what coredis makes of "ERR no such key"
]


@pytest.mark.parametrize(
    "reply",
    [
        "NOGROUP No such key 'k' or consumer group 'g'",
        "UNBLOCKED force unblock from blocking operation",
        "NOSCRIPT No matching script",
        "READONLY You can't write against a read only replica.",
        "LOADING Redis is loading the dataset in memory",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "NOPERM this user has no permissions",
        "ERR no such key",
        "ERR unknown command 'FOO'",
        "FENCED no owner",
        "BUSY Redis is busy running a script.",
        "OOM command not allowed when used memory > 'maxmemory'.",
        "TRYAGAIN Multiple keys request during rehashing of slot",
    ],
)
def test_every_refusal_keeps_its_code_whichever_way_it_came(reply: str) -> None:
    """As coredis parses it (its client, its pipelines), as a lean connection reads it
    (`rsc.resp`, hiredis) and as redis-py parses it (the synchronous producer): the same code,
    the first word Redis sent (redis-py keeps none for `ERR`: its plain `ResponseError`)."""
    hiredis = pytest.importorskip("hiredis")
    from coredis.parser import Parser

    from rsc.resp import refusal

    code = reply.split(" ", 1)[0]
    assert error_code(Parser().parse_error(reply)) == code
    assert error_code(refusal(hiredis.ReplyError(reply))) == code
    from redis._parsers.base import BaseParser

    assert reply_code(BaseParser.parse_error(reply)) == (None if code == "ERR" else code)


def nested(exc: BaseException) -> BaseExceptionGroup[BaseException]:
    return BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [exc])])


def _fail(exc: BaseException) -> None:
    raise exc


def raised(exc: BaseException) -> BaseException:
    """What leaves `redis_call` when its block raises `exc`."""
    try:
        with redis_call("XACK k"):
            _fail(exc)
    except BaseException as out:
        return out
    raise AssertionError("nothing was raised")


@pytest.mark.parametrize("wrap", [lambda e: e, nested], ids=["bare", "in-groups"])
@pytest.mark.parametrize("exc", UNAVAILABLE, ids=lambda e: type(e).__name__)
def test_an_unavailable_redis_is_redis_unavailable(exc: BaseException, wrap: object) -> None:
    out = raised(wrap(exc))  # type: ignore[operator]
    assert isinstance(out, RedisUnavailable)
    assert str(out).startswith("XACK k: ")
    assert type(exc).__name__ in str(out)
    assert is_unavailable(exc)


@pytest.mark.parametrize("wrap", [lambda e: e, nested], ids=["bare", "in-groups"])
def test_a_fenced_script_is_fenced(wrap: object) -> None:
    out = raised(wrap(E.ResponseError("FENCED owned by another member")))  # type: ignore[operator]
    assert isinstance(out, Fenced)
    assert out.code == "FENCED"


@pytest.mark.parametrize(("exc", "code"), REFUSED, ids=lambda e: type(e).__name__)
def test_other_refusals_are_command_failures_with_their_code(exc: BaseException, code: str | None) -> None:
    out = raised(nested(exc))
    assert type(out) is RedisCommandFailed
    assert out.code == code
    assert not is_unavailable(exc)


def test_cancellations_and_bugs_travel_untouched() -> None:
    bug = KeyError("a bug")
    assert raised(bug) is bug
    mixed = BaseExceptionGroup("g", [E.ConnectionError("x"), ValueError("bug")])
    assert raised(mixed) is mixed  # a bug beside a Redis failure is not hidden

    async def cancelled() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            with redis_call("PING"):
                await trio.sleep(1)
        assert scope.cancelled_caught

    trio.run(cancelled)


def test_error_codes() -> None:
    assert error_code(E.ResponseError("FENCED no owner")) == "FENCED"
    # A plain refusal whose text starts with no code: coredis took the generic ERR off it.
    assert error_code(E.ResponseError("something lower case")) == "ERR"
    assert error_code(E.ConnectionError("FENCED")) is None


def test_a_refusal_is_classified_by_its_code_wherever_the_library_puts_it() -> None:
    """`reply_code` reads the code of a refusal, a script's per-shard refusal text, and a
    refusal coredis wraps inside a pipeline; text that is not a code is no code."""
    from rsc.redis_errors import reply_code

    assert reply_code(Exception("FENCED no owner")) == "FENCED"
    assert reply_code("NOGROUP No such key 'k' or consumer group 'g'") == "NOGROUP"
    wrapped = "Command # 1 (EVALSHA abc 1 k:owners billing {} 6) of pipeline caused error: FENCED owner token"
    assert reply_code(Exception(wrapped)) == "FENCED"
    assert reply_code("Connection lost while receiving response") is None


def test_a_cluster_fan_out_whose_node_did_not_answer_is_an_outage_not_a_bug() -> None:
    """coredis merges the replies of a command sent to every node (the SCRIPT EXISTS before a
    pipeline's scripts) by iterating each; a node's reply that is the connection error it met
    makes coredis' own merge raise TypeError (CI saw it at a test's teardown). That is a node
    that did not answer: an outage (`RedisUnavailable`, `StoreUnavailable`), found by where it
    was raised. A TypeError of anyone else's code stays a bug."""
    from coredis.response._callbacks import ClusterAlignedBoolsCombine

    merge = ClusterAlignedBoolsCombine()
    with pytest.raises(TypeError) as raised:
        merge.combine([], [(True,), coredis.exceptions.ConnectionError("connection attempt failed")])  # type: ignore[list-item]
    assert is_unavailable(raised.value)
    with pytest.raises(RedisUnavailable), redis_call("pipeline"):
        merge.combine([], [(True,), coredis.exceptions.ConnectionError("connection attempt failed")])  # type: ignore[list-item]

    def ours() -> None:
        raise TypeError("a bug of ours")

    with pytest.raises(TypeError) as bug:
        ours()
    assert not is_unavailable(bug.value)

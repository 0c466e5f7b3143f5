"""`rsc.http.json_io`: request bodies parsed by orjson where it can, by the standard library
where it cannot, with one outcome either way; answers written by orjson where it can.

`parse_json` of a `str` never takes orjson's path: it is the reference the bytes are held to
(same value, same types, same refusal code)."""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsc.http.errors import ApiError
from rsc.http.json_io import MAX_JSON_DEPTH, EncodedJSON, dump_json, parse_json

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def outcome(data: bytes | str) -> tuple[str, Any]:
    """What `parse_json` made of `data`: the value as exact JSON text (1 and 1.0 differ), or the
    refusal's status and code."""
    try:
        value = parse_json(data)
    except ApiError as error:
        return "refused", (error.status, error.code)
    return "value", json.dumps(value, sort_keys=True)


def same_as_the_standard_library(data: bytes) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert outcome(data)[0] == "refused"
        return
    if text.startswith("\ufeff"):  # (the standard library's detection drops a BOM; a str keeps it)
        text = text[1:]
    assert outcome(data) == outcome(text)


@SETTINGS
@given(json_values, st.sampled_from([None, 1, 2]))
def test_any_json_value_parses_to_the_same_value_by_either_way(value: Any, indent: int | None) -> None:
    data = json.dumps(value, indent=indent, ensure_ascii=False).encode()
    assert outcome(data) == ("value", json.dumps(value, sort_keys=True))
    same_as_the_standard_library(json.dumps(value, ensure_ascii=True).encode())


@SETTINGS
@given(st.binary(max_size=60) | st.text(max_size=40).map(str.encode))
def test_any_bytes_get_the_same_outcome_by_either_way(data: bytes) -> None:
    same_as_the_standard_library(data)


# What the two parsers are known to differ on, each held to the standard library's outcome.
EDGES = [
    b"NaN",
    b"[Infinity]",
    b"-Infinity",
    b"1e400",  # (the standard library reads infinity; it is refused later, by the schema)
    b'"\\ud800"',  # a lone surrogate
    b'{"memberId": "\\udc00x"}',
    b'"\\ud83d\\ude00"',  # a pair: one character
    b'{"a": 1, "a": 2}',
    b"123456789012345678901234567890",  # past 64 bits: an integer, never a float
    b"18446744073709551616",
    b"-9223372036854775809",
    b'{"memberEpoch": 99999999999999999999}',
    b"\xef\xbb\xbf{}",  # a byte order mark
    b'"\xff"',
    b'"\xed\xa0\x80"',  # a surrogate encoded in UTF-8
    b'"a\x01"',
    b'{"a":1}x',
    b"",
    b"  ",
    b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
    b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH,
    b"[" * 5000 + b"]" * 5000,  # past orjson's own limit too
    b'"\\u0000"',
]


def test_the_known_differences_get_the_standard_librarys_outcome() -> None:
    for data in EDGES:
        same_as_the_standard_library(data)
    assert outcome(b"123456789012345678901234567890") == ("value", "123456789012345678901234567890")
    assert outcome(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)) == (
        "refused",
        (400, "JSON_TOO_DEEP"),
    )
    assert outcome(b'"\\ud800"') == ("refused", (400, "MALFORMED_JSON"))
    assert outcome(b"NaN") == ("refused", (400, "MALFORMED_JSON"))
    assert parse_json("\ufeff{}".encode()) == {}


def test_a_body_in_utf16_is_still_read() -> None:
    assert parse_json('{"a": [1, "é"]}'.encode("utf-16")) == {"a": [1, "é"]}


@SETTINGS
@given(json_values)
def test_answers_are_json_that_reads_back_to_the_same_value(value: Any) -> None:
    assert json.loads(dump_json(value)) == value


def test_what_orjson_cannot_write_is_written_as_before() -> None:
    assert dump_json({"n": 2**70}) == b'{"n":1180591620717411303424}'
    assert json.loads(dump_json({"s": "\ud800"})) == {"s": "\ud800"}
    assert dump_json({"a": [1, 2.5, None, True, "é"]}) == '{"a":[1,2.5,null,true,"é"]}'.encode()


def test_what_the_standard_library_refused_to_write_is_still_refused() -> None:
    @dataclasses.dataclass
    class Point:
        x: int

    for value in (Point(1), datetime.datetime(2026, 12, 5), datetime.date(2026, 12, 5)):
        with pytest.raises(TypeError):
            dump_json({"v": value})


@SETTINGS
@given(st.lists(json_values, max_size=4), st.booleans())
def test_json_already_written_goes_in_as_it_is_by_either_way(values: list[Any], big: bool) -> None:
    # (an integer past 64 bits elsewhere in the answer sends it the standard library's way)
    encoded = [EncodedJSON(dump_json(v)) for v in values]
    answer = {"responses": encoded, "n": 2**70 if big else 1}
    assert json.loads(dump_json(answer)) == {"responses": values, "n": 2**70 if big else 1}
    for refused in (object(), b"bytes are not JSON"):
        with pytest.raises(TypeError):
            dump_json({"responses": [*encoded, refused], "n": 2**70 if big else 1})


def test_json_already_written_takes_orjsons_way() -> None:
    # (the standard library would write the é as \u00e9: the answer went orjson's way)
    assert dump_json([EncodedJSON(b'{"a":[1]}'), "é"]) == '[{"a":[1]},"é"]'.encode()


def test_a_number_past_what_a_double_holds_is_refused_by_either_way() -> None:
    # (the standard library read 1e400 as infinity, which no JSON answer can carry, and which a
    # steady heartbeat's memo would have written as null)
    for body in (b'{"lag": 1e400}', '{"lag": -1e400}', b'{"n": 1234567890123456789012, "lag": 1e400}'):
        with pytest.raises(ApiError) as refused:
            parse_json(body)
        assert (refused.value.status, refused.value.code) == (400, "MALFORMED_JSON")
    assert parse_json(b'{"lag": 1e308}') == {"lag": 1e308}

"""Fuzzing the request parsing and wire decoding (hypothesis, bounded), seeded by `tests/corpus/`.

Whatever bytes arrive, parsing and decoding end in a value or in the one
refusal family (`ApiError`, `CoordinationError`), which the app answers with
a 4xx; never another exception, which would be a 500. The corpus holds one
file per shape worth keeping (a crash found here is added as a file); the
last test replays every file against a real server over a socket.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from rsc.events import group, stream
from rsc.events.commands import CreateGroup, CreateStream
from rsc.events.errors import CoordinationError
from rsc.events.model import Layout, Shard, Timing
from rsc.events.wire import HeartbeatRequest, ProducerHeartbeatRequest
from rsc.http.admin.bodies import GroupSpec, PauseRequest, StreamSpec
from rsc.http.errors import ApiError
from rsc.http.heartbeats.routes import HeartbeatBatch
from rsc.http.json_io import parse_json, structure
from tests.httpkit import FAST, serve_on

CORPUS = sorted((Path(__file__).parents[1] / "corpus").glob("*.json"))
SEEDS = [path.read_bytes() for path in CORPUS]
WIRE_TYPES: list[type[Any]] = [
    HeartbeatRequest,
    ProducerHeartbeatRequest,
    HeartbeatBatch,
    StreamSpec,
    GroupSpec,
    PauseRequest,
]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)
FIELDS = [
    "protocolVersion", "streamPrefix", "consumerGroup", "memberId", "incarnation", "memberEpoch",
    "metadataVersion", "ownedShards", "revokedShards", "drainProgress", "client", "producerId",
    "quiesced", "leave", "heartbeats", "shardCount", "reshardMode", "maxConcurrency", "startFrom", "reason",
]  # fmt: skip
#: Objects with the real field names and arbitrary values: they get past the first checks.
shaped = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=12)


@st.composite
def mutated_seed(draw: st.DrawFn) -> bytes:
    """A corpus file with a few bytes replaced, inserted or removed."""
    data = bytearray(draw(st.sampled_from(SEEDS)) or b"{}")
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        op = draw(st.sampled_from(["replace", "insert", "delete"]))
        byte = draw(st.integers(0, 255))
        if op == "replace" and data:
            data[at] = byte
        elif op == "insert":
            data.insert(at, byte)
        elif data:
            del data[at]
    return bytes(data)


def decode(data: bytes) -> list[Any]:
    """Parse and decode `data` as every wire type; return what decoded. Only refusals may escape."""
    decoded = []
    refusals = []
    try:
        value = parse_json(data)
    except ApiError as error:
        return check_refusal(error)
    for wire_type in WIRE_TYPES:
        try:
            decoded.append(structure(value, wire_type))
        except ApiError as error:
            refusals.append(error)
    for refusal in refusals:
        check_refusal(refusal)
    return decoded


def check_refusal(error: ApiError) -> list[Any]:
    assert 400 <= error.status < 500
    assert error.code
    return []


LAYOUT = Layout(1, tuple(Shard(i, f"orders:{i}") for i in range(4)))
GROUP = group.execute(None, CreateGroup("orders", "billing", LAYOUT, Timing(), now_ms=0))[0]
STREAM = stream.execute(None, CreateStream("orders", 4, now_ms=0))[0]


def decide_all(decoded: list[Any]) -> None:
    """What decoded goes on to the pure core: it decides, or refuses with a `CoordinationError`."""
    for value in decoded:
        try:
            if isinstance(value, HeartbeatRequest):
                group.execute(GROUP, value.to_command(1_000))
            elif isinstance(value, ProducerHeartbeatRequest):
                stream.execute(STREAM, value.to_command(1_000, 10_000))
            elif isinstance(value, HeartbeatBatch):
                for item in value.heartbeats:
                    if isinstance(item, dict):
                        decide_all(decode(json.dumps(item).encode()))
        except CoordinationError:
            pass


@FUZZ
@given(st.binary(max_size=300) | mutated_seed())
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    decide_all(decode(data))


@FUZZ
@given(json_values | shaped)
def test_any_json_decodes_or_is_refused(value: Any) -> None:
    decide_all(decode(json.dumps(value).encode()))


@FUZZ
@given(shaped, st.sampled_from(SEEDS))
def test_seeds_with_fields_overwritten(overwrite: dict[str, Any], seed: bytes) -> None:
    try:
        base = json.loads(seed)
    except (ValueError, RecursionError):
        base = {}
    merged = {**base, **overwrite} if isinstance(base, dict) else overwrite
    decide_all(decode(json.dumps(merged).encode()))


def test_every_corpus_file_decodes_or_is_refused() -> None:
    assert len(CORPUS) >= 20
    for data in SEEDS:
        decide_all(decode(data))


async def test_the_corpus_over_a_socket_never_gets_a_5xx(standalone_url: str) -> None:
    endpoints = [
        ("POST", "/v1/heartbeat"),
        ("POST", "/v1/heartbeats"),
        ("POST", "/v1/producers/heartbeat"),
        ("PUT", "/v1/admin/streams/fuzz"),
        ("PUT", "/v1/admin/streams/fuzz/groups/g"),
        ("POST", "/v1/admin/streams/fuzz/pause"),
    ]
    server = attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")
    async with serve_on(server) as client:
        for path in CORPUS:
            for method, endpoint in endpoints:
                response = await client.request(
                    method,
                    endpoint,
                    content=path.read_bytes(),
                    auth=("admin", "pw"),
                    headers={"Content-Type": "application/json"},
                )
                assert response.status_code < 500, (path.name, endpoint, response.text)
                if response.status_code >= 400:
                    assert response.json()["error"], (path.name, endpoint)

"""Every command, event and wire type survives a JSON round trip; names are camelCase."""

from __future__ import annotations

import json
import re
import typing

import attrs
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rsc.events import codec, commands, events, model, wire
from rsc.events.commands import GroupCommand, StreamCommand
from rsc.events.events import GroupEvent, MemberJoined, StreamEvent
from rsc.events.group import GroupState
from rsc.events.model import STREAM_ID_PATTERN, ClientInfo, Producer, up_to
from rsc.events.stream import StreamState
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from tests.groupkit import Group

UNIONS = [GroupEvent, StreamEvent, GroupCommand, StreamCommand]
MEMBERS = [cls for union in UNIONS for cls in typing.get_args(union)]


def _resolve_all() -> None:
    """Resolve string annotations so hypothesis can build every attrs class."""
    for module in (model, wire, commands, events):
        for value in vars(module).values():
            if isinstance(value, type) and attrs.has(value):
                attrs.resolve_types(value)


def _field_strategy(schema: dict[str, typing.Any], tp: typing.Any) -> st.SearchStrategy[typing.Any]:
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    if "minimum" in schema or "maximum" in schema:
        ints = st.integers(schema.get("minimum"), schema.get("maximum"))
        return st.none() | ints if type(None) in typing.get_args(tp) else ints
    if "items" in schema:
        return st.frozensets(st.integers(min_value=schema["items"].get("minimum")))
    if "minLength" in schema:
        return st.text(min_size=schema["minLength"], max_size=schema.get("maxLength"))
    return st.from_type(tp)


def _register_constrained() -> None:
    """Build `wire_field`-constrained classes within their constraints only."""
    for module in (model, wire, commands, events):
        for value in vars(module).values():
            if not (isinstance(value, type) and attrs.has(value)):
                continue
            constrained = {
                f.name: _field_strategy(f.metadata["json_schema"], f.type)
                for f in attrs.fields(value)
                if "json_schema" in f.metadata
            }
            if constrained:
                st.register_type_strategy(value, st.builds(value, **constrained))


_resolve_all()
_register_constrained()


@pytest.mark.parametrize("cls", MEMBERS, ids=lambda c: c.__name__)
@given(data=st.data())
def test_round_trip_through_the_union(cls: type, data: st.DataObject) -> None:
    union = next(u for u in UNIONS if cls in typing.get_args(u))
    value = data.draw(st.builds(cls))
    text = codec.to_json(value, union)
    assert json.loads(text)["type"] == cls.__name__
    assert codec.from_json(text, union) == value


@given(st.from_type(HeartbeatRequest), st.builds(HeartbeatResponse))
def test_wire_types_round_trip(request: HeartbeatRequest, response: HeartbeatResponse) -> None:
    assert codec.from_json(codec.to_json(request), HeartbeatRequest) == request
    assert codec.from_json(codec.to_json(response), HeartbeatResponse) == response


def test_wire_names_are_camel_case_and_unknown_fields_ignored() -> None:
    data = json.loads(codec.to_json(MemberJoined("m", "i", ClientInfo(), 5, 2), GroupEvent))
    assert set(data) == {"type", "memberId", "incarnation", "client", "joinedAtMs", "groupEpoch"}
    data["addedInAFutureMinor"] = True
    assert codec.converter.structure(data, GroupEvent) == MemberJoined("m", "i", ClientInfo(), 5, 2)


def test_snapshot_round_trip_of_a_busy_group() -> None:
    g = Group.create(shards=7)
    r = g.hb("a", 0)
    g.hb("a", r.member_epoch, owned=r.assignment.assigned)
    g.hb("b", 0)
    g.hb("a", r.member_epoch, owned=r.assignment.assigned)
    assert codec.from_json(codec.to_json(g.state), GroupState) == g.state


def test_a_checkpoint_written_with_lease_deadlines_still_reads() -> None:
    """Checkpoints from before leases left the state hold `leaseDeadlineMs` per producer: ignored."""
    old = (
        '{"streamPrefix":"orders","layout":{"metadataVersion":1,"shards":[{"index":0,'
        '"key":"orders:{orders:0}","state":"ACTIVE"}],"routing":"jump-v1"},"createdAtMs":0,'
        '"reshardMode":"online","groups":{"billing":"earliest"},"producers":{"p1":{"producerId":"p1",'
        '"ackedVersion":1,"quiesced":false,"leaseTtlMs":1000,"registeredAtMs":5,'
        '"client":{"name":"rsc","version":"1"},"leaseDeadlineMs":1005}},"paused":null,"deleted":false}'
    )
    state = codec.from_json(old, StreamState)
    assert state.producers["p1"] == Producer("p1", 1, False, 1_000, 5, ClientInfo("rsc", "1"))
    assert "leaseDeadlineMs" not in codec.to_json(state)
    assert "leases" not in codec.to_json(Group.create().state)


@given(st.integers(0, 10**20 - 1) | st.integers(2**64 - 3, 2**64 + 3))
def test_up_to_matches_exactly_the_numbers_up_to_its_limit(n: int) -> None:
    """The stream-id pattern in `/openapi.json` is the server's check: every part of a Redis
    stream id up to 2^64-1 is accepted, nothing above (a 500 from Redis before)."""
    pattern = re.compile(f"^{up_to(2**64 - 1)}$")
    assert (pattern.fullmatch(str(n)) is not None) == (n <= 2**64 - 1)
    assert (pattern.fullmatch(str(n).zfill(20)) is not None) == (n <= 2**64 - 1)
    assert re.fullmatch(STREAM_ID_PATTERN, f"{n}-0") is not None or n > 2**64 - 1
    assert re.fullmatch(STREAM_ID_PATTERN, f"0-{n}") is not None or n > 2**64 - 1


#: What an unstructured value holds: JSON's own values, and the integer keys of a state's maps.
_KEYS = st.text() | st.integers(-(2**70), 2**70)
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


@given(_JSONISH)
@example({"\x7f": ["\x7f", "é", "\ud800", 2**64, True]})  # DEL, non-ASCII, a lone surrogate, big
@example({1: "a", False: None, None: 2})
def test_to_json_writes_what_json_dumps_wrote(data: typing.Any) -> None:
    """Journals, checkpoints and owner tokens hold the text `json.dumps` wrote (non-ASCII
    escaped) whichever writer writes it: the same text for any value, non-ASCII text and
    integers past 64 bits included."""
    expected = json.dumps(data, separators=(",", ":"))
    assert codec.to_json(data) == expected

"""The one place where domain values become JSON-ready data and back.

One configured cattrs converter serves the journal, snapshots and the HTTP
wire: attribute names become camelCase, enums their values, sets sorted
lists, and each event or command family a tagged union with a `type` field
naming the class. Domain modules never import cattrs; only this one does.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Set
from typing import Any, TypeVar

import attrs
import cattrs
import orjson
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.strategies import configure_tagged_union

from rsc.events.commands import GroupCommand, StreamCommand
from rsc.events.events import GroupEvent, StreamEvent
from rsc.events.group_position import ToIds, ToTime

T = TypeVar("T")
TAG = "type"


def camel(name: str) -> str:
    """`member_epoch` -> `memberEpoch`."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _is_set(tp: Any) -> bool:
    origin = getattr(tp, "__origin__", tp)
    return isinstance(origin, type) and issubclass(origin, Set)


def _renames(cl: Any) -> dict[str, Any]:
    """camelCase names; fields marked `omit_if_default` are left out while at their default."""
    return {
        a.name: override(rename=camel(a.name), omit_if_default=a.metadata.get("omit_if_default", False))
        for a in attrs.fields(cl)
    }


def make_converter(strict: bool = False, detailed: bool = True) -> cattrs.Converter:
    """Build a converter: `converter` (journal, snapshots) or, strict, `wire` (client input).

    The strict one refuses a string where a number is due and a number where
    a string is due, instead of converting; it never reads map keys as
    numbers, which only the journal needs.
    """
    conv = cattrs.Converter(forbid_extra_keys=False, detailed_validation=detailed)
    if strict:
        conv.register_structure_hook(int, _strict_int)
        conv.register_structure_hook(str, _strict_str)
        conv.register_structure_hook(bool, _strict_bool)
        conv.register_structure_hook_factory(_is_homogeneous_collection, _array_only)
    conv.register_unstructure_hook_factory(
        attrs.has, lambda cl: make_dict_unstructure_fn(cl, conv, **_renames(cl))
    )
    conv.register_structure_hook_factory(
        attrs.has, lambda cl: _object_only(make_dict_structure_fn(cl, conv, **_renames(cl)), strict)
    )
    conv.register_unstructure_hook_func(_is_set, sorted)
    for union in (GroupEvent, StreamEvent, GroupCommand, StreamCommand):
        configure_tagged_union(union, conv, tag_generator=lambda cl: cl.__name__, tag_name=TAG)
    conv.register_structure_hook_func(_is_position_union, lambda v, tp: _position(conv, v, tp))
    return conv


def _is_position_union(tp: Any) -> bool:
    """`ToTime | ToIds` (with or without None): a start or a reset given by a time or by ids."""
    members = set(typing.get_args(tp)) - {type(None)}
    return members == {ToTime, ToIds}


def _position(conv: cattrs.Converter, value: Any, tp: Any) -> Any:
    """The member of `ToTime | ToIds` the object's one field names (`timeMs` or `ids`)."""
    if value is None and type(None) in typing.get_args(tp):
        return None
    if isinstance(value, dict) and set(value) == {"timeMs"}:
        return conv.structure(value, ToTime)
    if isinstance(value, dict) and set(value) == {"ids"}:
        return conv.structure(value, ToIds)
    raise ValueError('expected {"timeMs": T} or {"ids": {"<shard>": "<id>"}}')


def _is_homogeneous_collection(tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        return len(args) == 2 and args[1] is Ellipsis
    return origin in (frozenset, set, Set) and len(args) == 1


def _array_only(tp: Any, conv: cattrs.Converter) -> Any:
    """Strictly, tuples and sets are read only from JSON arrays (an object would read as its keys)."""
    item = typing.get_args(tp)[0]
    make = tuple if typing.get_origin(tp) is tuple else frozenset
    item_hook = conv.get_structure_hook(item)

    def from_array(value: Any, _: type) -> Any:
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {type(value).__name__}")
        return make(item_hook(v, item) for v in value)

    return from_array


def _object_only(structure: Any, strict: bool) -> Any:
    """Strictly, an attrs class is read only from a JSON object (a list would read as all defaults)."""
    if not strict:
        return structure

    def from_object(value: Any, cl: type) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        return structure(value, cl)

    return from_object


def _strict_int(value: Any, _: type) -> int:
    # JSON Schema counts 3.0 as an integer; "3", 3.5 and true are not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _strict_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _strict_bool(value: Any, _: type) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {type(value).__name__}")
    return value


converter = make_converter()
#: For what clients send: no silent type conversions.
wire = make_converter(strict=True)


def to_json(value: Any, as_type: Any = None) -> str:
    """Serialize `value` (as `as_type`, e.g. a union, when given) to compact JSON, with
    non-ASCII characters escaped (`\\uXXXX`): the same text `json.dumps` writes, which journals
    hold since the first release. orjson writes it (a journal event, an owner token and a
    checkpoint are written on every heartbeat that changes a group: several times faster);
    what it writes otherwise (a non-ASCII character or DEL, an integer past 64 bits) goes to
    `json.dumps`."""
    data = converter.unstructure(value, unstructure_as=as_type)
    try:
        text = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        text = b"\xff"  # (not ASCII: written the long way below)
    if text.isascii() and b"\x7f" not in text:  # (json.dumps escapes DEL too)
        return text.decode("ascii")
    return json.dumps(data, separators=(",", ":"), sort_keys=False)


def from_json(text: str | bytes, as_type: type[T]) -> T:
    """Parse JSON into `as_type`; raises `cattrs` errors on a shape mismatch."""
    return converter.structure(json.loads(text), as_type)

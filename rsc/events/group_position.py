"""A consumer group's position over every shard, and an operator's reset of it (feature level
7), as pure rules: where each shard's last-delivered id goes for each kind of reset, how ids
compare, and the plan a reset answers (what is delivered again or skipped per shard).

Redis says where a group stands (`ShardPosition`, read by `coordinator/read_position.lua`) and
how many entries lie between two ids (counted in bounded chunks by the caller); this module
decides the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

import attrs

from rsc.events.errors import InvalidCommand
from rsc.events.model import MAX_COUNTER, up_to, wire_field

#: The largest sequence number (and time) of an entry id (2^64 - 1).
MAX_SEQ = 18_446_744_073_709_551_615
#: An entry id: milliseconds, a dash, a sequence number (each from 0 to 2^64 - 1).
ENTRY_ID = f"(?:{up_to(MAX_SEQ)})-(?:{up_to(MAX_SEQ)})"
_ENTRY_ID = re.compile(ENTRY_ID)
#: The highest shard index.
MAX_SHARD_INDEX = 16_383
#: How many entries between two positions are counted exactly, per shard; above that the plan
#: says a lower bound (`exact: false`).
COUNT_LIMIT = 1_000_000


@attrs.frozen
class ToTime:
    """Reset to a time: every entry whose id time is at or after `timeMs` is delivered (again)."""

    time_ms: int = wire_field(minimum=0, maximum=MAX_COUNTER)


@attrs.frozen
class ToIds:
    """Reset to given positions: shard index -> the new last-delivered id (a plan's `ids` sent
    back); shards not named keep theirs."""

    ids: Mapping[str, str] = attrs.field(
        validator=lambda _, __, value: _check_ids(value),
        metadata={
            "json_schema": {
                "minProperties": 1,
                # (anchored at the very end in every regex dialect: no trailing newline)
                "propertyNames": {"pattern": f"^(?:{up_to(MAX_SHARD_INDEX)})(?![\\s\\S])"},
                "additionalProperties": {"type": "string", "pattern": f"^(?:{ENTRY_ID})(?![\\s\\S])"},
            }
        },
    )


ResetTarget = Literal["earliest", "latest"] | ToTime | ToIds


def entry_id(text: str) -> tuple[int, int]:
    """`<ms>-<seq>` as a pair that orders like Redis orders ids. Raises `ValueError`."""
    if not _ENTRY_ID.fullmatch(text):
        raise ValueError(f"not an entry id: {text!r}")
    ms, seq = text.split("-")
    return int(ms), int(seq)


def _check_ids(ids: object) -> None:
    """Raises `InvalidCommand` unless `ids` maps shard indexes to entry ids (at least one)."""
    if not isinstance(ids, Mapping) or not ids:
        raise InvalidCommand('ids must be an object of shard index -> entry id, e.g. {"0": "1700-0"}')
    for shard, value in ids.items():
        if not (isinstance(shard, str) and re.fullmatch(f"(?:{up_to(MAX_SHARD_INDEX)})", shard)):
            raise InvalidCommand(f"ids: {shard!r} is not a shard index (0-16383)")
        if not isinstance(value, str) or not _ENTRY_ID.fullmatch(value):
            raise InvalidCommand(f"ids[{shard!r}]: {value!r} is not an entry id (<ms>-<seq>)")


def parse_target(raw: object) -> ResetTarget:
    """The reset target of a request's `to`. Raises `InvalidCommand` naming what is wrong."""
    if raw in ("earliest", "latest"):
        return "earliest" if raw == "earliest" else "latest"
    if isinstance(raw, dict) and set(raw) == {"timeMs"}:
        time_ms = raw["timeMs"]
        if isinstance(time_ms, float) and time_ms.is_integer():  # JSON Schema: 3.0 is an integer
            time_ms = int(time_ms)
        if isinstance(time_ms, bool) or not isinstance(time_ms, int) or not 0 <= time_ms <= MAX_COUNTER:
            raise InvalidCommand(f"to.timeMs must be an integer from 0 to {MAX_COUNTER}")
        return ToTime(time_ms)
    if isinstance(raw, dict) and set(raw) == {"ids"}:
        try:
            _check_ids(raw["ids"])
        except InvalidCommand as exc:
            raise InvalidCommand(f"to.{exc}") from exc
        return ToIds({str(int(s)): v for s, v in raw["ids"].items()})
    raise InvalidCommand('to must be "earliest", "latest", {"timeMs": T} or {"ids": {"<shard>": "<id>"}}')


@attrs.frozen
class ShardPosition:
    """Where one group stands on one shard key, as Redis says."""

    key_exists: bool
    first_id: str | None
    last_id: str
    entries_added: int
    length: int
    group_exists: bool
    last_delivered: str
    entries_read: int | None
    pending: int


def new_position(target: ResetTarget, shard: int, position: ShardPosition) -> str | None:
    """The last-delivered id `target` puts the group at on this shard (None: unchanged)."""
    match target:
        case "earliest":
            return "0-0"
        case "latest":
            return position.last_id
        case ToTime(time_ms=0):
            return "0-0"
        case ToTime(time_ms=t):
            return f"{t - 1}-{MAX_SEQ}"  # the last id before t: entries at or after t follow
        case ToIds(ids=ids):
            return ids.get(str(shard))
    raise AssertionError(target)  # (every kind is matched above)


@attrs.frozen
class ShardPlan:
    """One shard of a reset's plan. `redelivered`/`skipped`: entries between the current and the
    new position (exact, or a lower bound when `exact` is false). `oldest`: the oldest entry the
    key still holds (retention may have removed older ones: a rewind reaches only these), and
    `beforeOldest` says the new position lies before it."""

    shard: int
    key: str
    state: str
    reachable: bool
    current: str | None = None
    new: str | None = None
    redelivered: int = 0
    skipped: int = 0
    exact: bool = True
    pending: int = 0
    oldest: str | None = None
    before_oldest: bool = False
    why: str | None = None


@attrs.frozen
class ResetPlan:
    """A reset's plan (and, executed, what was done). `ids`: the new positions, shard index ->
    id, to send back as `{"to": {"ids": ...}}`; `members`: the group's live members when read."""

    stream_prefix: str
    consumer_group: str
    dry_run: bool
    executed: bool
    shards: tuple[ShardPlan, ...]
    ids: Mapping[str, str]
    members: tuple[str, ...] = ()


__all__ = [
    "COUNT_LIMIT",
    "ENTRY_ID",
    "ResetPlan",
    "ResetTarget",
    "ShardPlan",
    "ShardPosition",
    "ToIds",
    "ToTime",
    "entry_id",
    "new_position",
    "parse_target",
]

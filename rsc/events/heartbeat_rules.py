"""The rules of a heartbeat as the coordinator's edge applies them, pure: what it may create or
rebuild, whether and under which key it is rate limited, and the shape of its answer.

* Only a join (`memberEpoch` 0) may create a group (and its stream), and only where groups
  are created automatically and the caller may create: a member that is not joining speaks of
  a group it was in, so a missing group is news to it, not a request (`creates_group`). A
  producer's heartbeat leaves creating its stream to the deployment (`auto_create_streams`),
  unless its caller may not create (`producer_creates`).
* The layout version a party says it was told (`seen_version`, `producer_seen_version`) is a
  sign, if Redis holds nothing of its group or stream, that Redis lost it (the registry then
  rebuilds it). A join or a leave says nothing of the kind, and a caller that may not create
  never makes anything rebuilt: 0 for them.
* A join carries its caller's `members_per_group` quota, which the group checks
  (`with_join_quota`).
* A leave is never rate limited (`limited`, `producer_limited`); a batch costs its caller one
  token an item, its leaves free (`batch_cost`).
* A party's own rate limit is keyed by its names (a member's incarnation too) and by the
  credential that speaks for it, never by its address: behind a proxy every caller shares
  one. With the incarnation, a caller sending heartbeats under another's member id spends
  only its own tokens (`member_key`, `producer_key`).
* Protocol work is not charged to a member's own limit (`member_charge`): the first join of
  an incarnation is charged to its member id's join limit instead (without the incarnation,
  so a process crash-looping through joins under new incarnations is still limited; a rejoin
  of a known incarnation is charged to its own limit as before), and a heartbeat
  that acknowledges revokes it has not acknowledged before at its epoch is free
  (`acknowledges_news`). Echoing the same `revokedShards`, or a heartbeat with nothing new,
  is charged.
* An answer takes the shape of the protocol version it answers (`answered_in`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs

from rsc.events import codec, quotas
from rsc.events.auth import Credential
from rsc.events.commands import Heartbeat
from rsc.events.model import Layout, check_id, check_name
from rsc.events.wire import (
    HeartbeatRequest,
    HeartbeatResponse,
    ProducerHeartbeatRequest,
    ProducerHeartbeatResponse,
    check_protocol_version,
)

#: The `memberEpoch` of a join and of a leave.
JOIN_EPOCH, LEAVE_EPOCH = 0, -1

R = TypeVar("R", HeartbeatResponse, ProducerHeartbeatResponse)


def creates_group(body: HeartbeatRequest, auto_create_groups: bool, may_create: bool) -> bool:
    """Whether the heartbeat `body` may create its group (and stream): a join, where groups are
    created automatically and its caller `may_create`. Raises nothing."""
    return auto_create_groups and may_create and body.member_epoch == JOIN_EPOCH


def with_join_quota(command: Heartbeat, max_members: int) -> Heartbeat:
    """`command` with its caller's `members_per_group` quota (`max_members`) if it is a join,
    which the group checks; any other heartbeat as it is. Raises nothing."""
    if command.member_epoch != JOIN_EPOCH:
        return command
    return attrs.evolve(command, max_members=max_members)


def seen_version(body: HeartbeatRequest, may_create: bool) -> int:
    """The layout version a member already in its group (not a join, not a leave) says it was
    told; 0 for a caller that may not create (it never makes a group rebuilt). Raises nothing."""
    return body.metadata_version if may_create and body.member_epoch > JOIN_EPOCH else 0


def producer_creates(may_create: bool) -> bool | None:
    """Whether a producer's heartbeat may create its stream: None (as the deployment creates
    streams automatically, or not) when its caller `may_create`, else False. Raises nothing."""
    return None if may_create else False


def producer_seen_version(body: ProducerHeartbeatRequest, may_create: bool) -> int:
    """The layout version a producer says it was told; 0 for a caller that may not create (it
    never makes a stream rebuilt). Raises nothing."""
    return body.metadata_version if may_create else 0


def limited(body: HeartbeatRequest) -> bool:
    """Whether the member heartbeat `body` is rate limited: all but a leave. Raises nothing."""
    return body.member_epoch != LEAVE_EPOCH


def producer_limited(body: ProducerHeartbeatRequest) -> bool:
    """Whether the producer heartbeat `body` is rate limited: all but a leave. Raises nothing."""
    return not body.leave


#: What a member's heartbeat is charged to (`member_charge`).
CHARGE_NONE, CHARGE_JOIN, CHARGE_PARTY = "none", "join", "party"

#: What a member acknowledged last (`acknowledges_news`): an epoch, and the shards
#: acknowledged at it.
Acknowledged = tuple[int, frozenset[int]]


def acknowledges_news(body: HeartbeatRequest, last: Acknowledged | None) -> Acknowledged | None:
    """If `body` acknowledges revokes its member has not acknowledged before (`last`: what it
    acknowledged last), what it has acknowledged after it; else None (nothing new: charged).

    New means: at a newer epoch than `last`'s, or at the same epoch shards not acknowledged at
    it yet. A retry, an echo or an alternation of the same sets at one epoch is not new, nor
    an older epoch's. Raises nothing."""
    revoked = body.revoked_shards
    if not revoked or body.member_epoch <= 0:
        return None
    if last is None or body.member_epoch > last[0]:
        return (body.member_epoch, revoked)
    if body.member_epoch == last[0] and not revoked <= last[1]:
        return (body.member_epoch, last[1] | revoked)
    return None


def member_charge(body: HeartbeatRequest, known: bool, last: Acknowledged | None) -> str:
    """The limit a member's heartbeat is charged to: none for a leave or for news of revokes
    (`acknowledges_news`); its member id's join limit for the first join of an incarnation
    (`known`: its key was seen before); else its own (party) limit, a rejoin of a known
    incarnation (told to, after a fence) too. Raises nothing."""
    if body.member_epoch == LEAVE_EPOCH:
        return CHARGE_NONE
    if body.member_epoch == 0:
        return CHARGE_PARTY if known else CHARGE_JOIN
    return CHARGE_NONE if acknowledges_news(body, last) is not None else CHARGE_PARTY


def join_key_suffix(member_suffix: str) -> str:
    """The key suffix of a member id's join limit: its `member_key_suffix` without the
    incarnation. Raises nothing."""
    return member_suffix.rsplit("\n", 1)[0]


def batch_cost(items: Sequence[Mapping[str, Any]]) -> int:
    """The tokens a batch of heartbeats (its items as JSON objects, not yet parsed) costs its
    caller: one an item, a leave free. Raises nothing."""
    leaves = sum(1 for item in items if item.get("memberEpoch") == LEAVE_EPOCH)
    return len(items) - leaves


def member_key(caller: Credential | None, body: HeartbeatRequest) -> str:
    """The key of a member's own rate limit: the credential that speaks for it (or
    `quotas.ANONYMOUS`), its stream, group, member id and incarnation.

    Raises `InvalidCommand` for a name or id that is not well formed (checked first: a key is
    bounded and unambiguous)."""
    return keyed_by(caller, member_key_suffix(body))


def member_key_suffix(body: HeartbeatRequest) -> str:
    """`member_key` without the caller's part (its stream, group, member id and incarnation),
    which depends on the body alone (`keyed_by` puts the caller's in front). Raises
    `InvalidCommand` as `member_key` does."""
    check_name(body.stream_prefix, "streamPrefix")
    check_name(body.consumer_group, "consumerGroup")
    check_id(body.member_id, "memberId")
    check_id(body.incarnation, "incarnation")
    return "\n".join((body.stream_prefix, body.consumer_group, body.member_id, body.incarnation))


def keyed_by(caller: Credential | None, suffix: str) -> str:
    """A party's rate-limit key: the credential that speaks for it (or `quotas.ANONYMOUS`)
    before its own `suffix`. Raises nothing."""
    return (caller.name if caller is not None else quotas.ANONYMOUS) + "\n" + suffix


def producer_key(caller: Credential | None, body: ProducerHeartbeatRequest) -> str:
    """The key of a producer's own rate limit (see `member_key`).

    Raises `InvalidCommand` for a stream prefix or producer id that is not well formed."""
    check_name(body.stream_prefix, "streamPrefix")
    check_id(body.producer_id, "producerId")
    return keyed_by(caller, body.stream_prefix + "\n" + body.producer_id)


def answered_in(response: R, requested: int, level: int) -> R:
    """`response` in the protocol version a request of `requested` is answered in: from version
    2 on it names that version and the deployment's feature `level`; a version 1 answer has
    exactly version 1's shape.

    Raises `UnsupportedProtocolVersion` for a version older than every one this server speaks
    (a request's version is checked when it becomes a command, so a route never sees it)."""
    version = check_protocol_version(requested)
    if version < 2:  # from version 2 on, an answer names its version and the level
        if isinstance(response, HeartbeatResponse) and response.revoke_timeout_ms is not None:
            return attrs.evolve(response, revoke_timeout_ms=None)  # came with version 2
        return response
    return attrs.evolve(response, protocol_version=version, feature_level=level)


#: The last layouts rendered (`_layout_json`), by identity: a layout is immutable, and every
#: member told it gets the same object until the next change.
_RENDERED: dict[int, tuple[Layout, dict[str, Any]]] = {}


def _layout_json(layout: Layout) -> dict[str, Any]:
    """`codec.wire.unstructure(layout)`, rendered once per layout object (shared: not to be
    changed)."""
    known = _RENDERED.get(id(layout))
    if known is not None and known[0] is layout:
        return known[1]
    data: dict[str, Any] = codec.wire.unstructure(layout)
    if len(_RENDERED) >= 8:
        _RENDERED.pop(next(iter(_RENDERED)))
    _RENDERED[id(layout)] = (layout, data)
    return data


#: The answer fields that come after `protocolVersion` and `featureLevel` (in field order).
_AFTER_VERSION = ("static", "revokeTimeoutMs")


def answered_json(response: HeartbeatResponse, requested: int, level: int) -> dict[str, Any]:
    """`codec.wire.unstructure(answered_in(response, requested, level))` for a member's answer
    that names no version yet (as `respond` makes it), without a copy of the answer: a batch
    renders a hundred. Raises `UnsupportedProtocolVersion` as `answered_in` does."""
    version = check_protocol_version(requested)
    layout = response.layout
    if layout is None:
        data: dict[str, Any] = codec.wire.unstructure(response)
    else:  # a layout of a thousand shards costs more to render than the rest: once a layout
        data = codec.wire.unstructure(attrs.evolve(response, layout=None))
        data["layout"] = _layout_json(layout)
    if version < 2:
        data.pop("revokeTimeoutMs", None)  # came with version 2
        return data
    after = {name: data.pop(name) for name in _AFTER_VERSION if name in data}
    data["protocolVersion"] = version
    data["featureLevel"] = level
    data.update(after)
    return data

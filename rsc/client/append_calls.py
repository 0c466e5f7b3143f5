"""The append scripts' calls and their replies (no I/O): what one `publish_many` sends to each
shard through `rsc/lua/member/append.lua`, and what the replies say is written, to send again,
to route again, or refused. Both producers build their calls here (`rsc.client.producer_state`
drives them across tries).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from rsc import lua
from rsc.events.wire import cap_key, producer_key, seal_key
from rsc.redis_errors import TRANSIENT_CODES, reply_code

#: What a message's fields may hold (Redis stores every value as bytes).
Fields = Mapping[str, str | bytes | int | float]
#: A partition key: messages with the same key go to the same shard under one layout.
Key = bytes | str | None


def entry_ids(results: Iterable[object]) -> list[str]:
    """The entry ids a pipeline of XADDs returned, as text."""
    return [r.decode() if isinstance(r, bytes) else str(r) for r in results]


#: How producers append (feature level 2; idempotent from 6): `rsc/lua/member/append.lua` (a
#: repeat answered with its first ids, then the seal and the cap checked, then the messages'
#: XADDs in order, atomic with the checks). One EVALSHA per shard a call writes to, in one
#: pipeline: the checks are made once per shard and call, not per message.
SEALED_APPEND = lua.script("member/append")
SEALED_APPEND_SHA = lua.sha1("member/append")
#: The least time a producer's record of its appends to a shard is kept after its last append
#: (the dedupe window is this, or twice the producer's delivery timeout if longer).
MIN_WINDOW_S = 120.0


#: A Redis command's arguments, as the client libraries take them.
Arg = str | bytes | int | float


@attrs.define
class Append:
    """One `SEALED_APPEND` call: the messages (their positions in the publish) for one shard.

    Its arguments are built when it is sent (`args`, `command`), so a sender can write the
    first shard's call while it builds the next. Idempotent (an `epoch`), it carries the
    sequence of its first message, which identifies the call on its shard: sent again as it
    is (never re-routed) until it is answered, it is appended once."""

    target: str
    positions: list[int]
    keys: list[str]
    #: The messages' fields, in the order of `positions`.
    fields: list[Fields]
    #: The producer epoch (None: not idempotent), the call's first sequence, the producer's
    #: floor when it is sent (`Publish.stamp`) and the record's lifetime (ms).
    epoch: int | None = None
    seq: int = 0
    low: int = 0
    window_ms: int = 0

    def args(self) -> list[Arg]:
        """ARGV: epoch, first sequence, floor, window; the number of messages, then per
        message its number of field values and them."""
        head: list[Arg] = (
            ["", 0, 0, 0] if self.epoch is None else [self.epoch, self.seq, self.low, self.window_ms]
        )
        args: list[Arg] = [*head, len(self.fields)]
        append = args.append
        for fields in self.fields:
            append(2 * len(fields))
            for pair in fields.items():  # (the fastest flattening measured: +=, not chain)
                args += pair
        return args

    def command(self) -> tuple[Arg, ...]:
        """The whole `EVALSHA` command, as `hiredis.pack_command` takes it."""
        return ("EVALSHA", SEALED_APPEND_SHA, len(self.keys), *self.keys, *self.args())


@attrs.frozen
class Ident:
    """Who appends: the producer id, its epoch (None: not idempotent), the sequence of the
    publish's first message (message `i` has `first + i`) and the record's lifetime."""

    producer_id: str
    epoch: int | None = None
    first: int = 0
    window_ms: int = 0


def appends(
    todo: Iterable[tuple[int, str]], messages: Sequence[tuple[Fields, Key]], ident: Ident | None = None
) -> list[Append]:
    """The calls for messages at positions `todo` routed to their shards, one per shard."""
    by_shard: dict[str, list[int]] = {}
    for position, target in todo:
        positions = by_shard.get(target)
        if positions is None:
            by_shard[target] = [position]
        else:
            positions.append(position)
    ident = ident or Ident("")
    return [
        Append(
            target,
            positions,
            [
                target,
                seal_key(target),
                cap_key(target),
                producer_key(target, ident.producer_id),
            ],
            [messages[p][0] for p in positions],
            ident.epoch,
            ident.first + positions[0],
            0,
            ident.window_ms,
        )
        for target, positions in by_shard.items()
    ]


#: The classes redis-py and coredis give the transient refusals whose code they strip.
_TRANSIENT_CLASSES = frozenset({"BusyLoadingError", "ReadOnlyError", "TryAgainError", "MasterDownError"})


def refusal(result: object) -> str | None:
    """For one reply of a publish pipeline: "SEALED" (re-route it), "FULL" (the shard is at its
    cap: send it again later), "NOSCRIPT" (load the script,
    send it again), "UNAVAILABLE" (a Redis loading, read-only, busy...: send it again later),
    another error's text, or None (written)."""
    if not isinstance(result, BaseException):
        return None
    if "NoScript" in type(result).__name__:  # redis-py and coredis strip the code from this one
        return "NOSCRIPT"
    code = reply_code(result)  # by its code, wherever the library puts it; never by its words
    if code in ("NOSCRIPT", "SEALED", "FULL", "OOM", "FENCED"):
        return code
    if code in TRANSIENT_CODES or type(result).__name__ in _TRANSIENT_CLASSES:
        return "UNAVAILABLE"
    return str(result) or type(result).__name__


@attrs.define
class Replies:
    """What a pipeline of `SEALED_APPEND` calls came back with."""

    #: Positions of the messages to send again (their shard was sealed, or the script unknown).
    again: list[int] = attrs.field(factory=list)
    #: The calls to send again as they are (refused before anything was appended: the script
    #: unknown, the shard full, Redis busy or out of memory), to the same shard.
    resend: list[Append] = attrs.field(factory=list)
    #: Positions of the messages whose shard was sealed: routed again with a newer layout.
    reroute: list[int] = attrs.field(factory=list)
    #: Calls answered as repeats of an append already made (nothing appended again).
    repeats: int = 0
    #: The producer's epoch was refused (another process took its id over): its text.
    fenced: str | None = None
    sealed: bool = False
    noscript: bool = False
    #: The refusal of a full shard (its cap, `whenFull: refuse`): its text, naming the shard.
    full: str | None = None
    #: Every shard key that refused as full.
    full_targets: list[str] = attrs.field(factory=list)
    #: Redis refused for want of memory (`OOM`): its text.
    oom: str | None = None
    #: A refusal of a Redis that may answer soon (`LOADING`, `READONLY`, `BUSY`...): its text.
    unavailable: str | None = None
    #: Another error (the call failed: some messages may have been written).
    failure: str | None = None


def take_replies(calls: Sequence[Append], results: Sequence[object], ids: list[str | None]) -> Replies:
    """Note in `ids` the entry ids written; what is to be sent again, and why."""
    out = Replies()
    for call, reply in zip(calls, results, strict=True):
        result = reply
        why = refusal(result)
        if why is None:
            if isinstance(result, list | tuple) and result and result[0] in (b"REPEAT", "REPEAT"):
                out.repeats += 1
                result = result[1:]
            if not isinstance(result, list | tuple) or len(result) != len(call.positions):
                out.failure = f"unexpected reply {result!r}"
                return out
            for position, entry_id in zip(call.positions, entry_ids(result), strict=True):
                ids[position] = entry_id
        elif why == "FENCED":
            out.fenced = str(result)
            return out
        elif why in ("SEALED", "NOSCRIPT", "UNAVAILABLE", "FULL", "OOM"):
            out.again.extend(call.positions)
            if why == "SEALED":
                out.reroute.extend(call.positions)
            else:
                out.resend.append(call)
            if why == "FULL":
                out.full = str(result)
                out.full_targets.append(call.target)
            elif why == "OOM":
                out.oom = str(result)
            out.sealed |= why == "SEALED"
            out.noscript |= why == "NOSCRIPT"
            if why in ("UNAVAILABLE", "NOSCRIPT"):
                # (a NOSCRIPT here outlived `rsc.scripts.reloading`'s loads: a failover
                # between load and call; sent again later, as while Redis does not answer)
                out.unavailable = str(result)
        else:
            out.failure = why
            return out
    return out

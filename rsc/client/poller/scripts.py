"""The member's fenced data-plane scripts (`rsc/lua/member/*.lua`), called with typed results.

While the poller runs on a standalone Redis reached over TCP, every call goes as one
`EVALSHA` on a lean multiplexed connection (`rsc.resp.Multiplexed`, shared by the poller's
tasks; `NOSCRIPT` loads the script and sends it again), not through coredis, whose machinery
around each call cost more CPU than the rest of an entry's way; elsewhere (a cluster, a
Sentinel's primary, no hiredis) through the coredis client.

The one place where the poller talks to its scripts: arguments built, replies parsed into
`Message`s, and every refusal mapped once to a typed error by its reply code (`Fenced` for
`FENCED`, else `RedisCommandFailed` with the code), never by its text. Calls go through
`rsc.client.redis_calls.redis_call`, so a whole call fails with `RedisUnavailable` (Redis did
not answer), `Fenced` or `RedisCommandFailed` (Redis refused it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# coredis imports its pipeline module on the first call of any script: loaded here, with the
# poller, rather than on a newly owned shard's first claim (a millisecond or more of a handoff).
import attrs

from rsc.client.errors import Fenced, RedisCommandFailed
from rsc.client.poller.book import ShardEntry
from rsc.client.poller.message import Message, pairs
from rsc.client.redis_calls import redis_call
from rsc.events.wire import dead_letter_key, owner_key
from rsc.lua import script
from rsc.redis_errors import reply_code
from rsc.resp import Multiplexed, eval_scripts

__all__ = ["MemberScripts", "ShardRead", "refusal"]

Entry = ShardEntry[Any]


@attrs.frozen
class ShardRead:
    """What a fenced read returned for one shard: its entries, its tail when the read caught up
    (else None), or why the shard was refused (then nothing else)."""

    messages: list[Message] = attrs.field(factory=list)
    tail: str | None = None
    refused: RedisCommandFailed | None = None


def refusal(text: str, context: str) -> RedisCommandFailed:
    """The typed error of a refusal a multi-shard script returned for one shard, by its code:
    `Fenced` for `FENCED`, else `RedisCommandFailed`."""
    code = reply_code(text)
    if code == "FENCED":
        return Fenced(text if not context else f"{context}: {text}", code)
    return RedisCommandFailed(f"{context or 'shard'}: {text}", code)


class MemberScripts:
    """The scripts of one member (consumer group, member id, incarnation) on one Redis client."""

    def __init__(self, redis: Any, group: str, member_id: str, incarnation: str) -> None:
        self.group = group
        self.member_id = member_id
        self.incarnation = incarnation
        #: The lean connection the calls go on while the poller runs (None: coredis).
        self.lean: Multiplexed | None = None
        self._read = redis.register_script(script("member/read"))
        self._claim = redis.register_script(script("member/claim"))
        self._reclaim = redis.register_script(script("member/reclaim"))
        self._ack = redis.register_script(script("member/ack"))
        self._dead = redis.register_script(script("member/dead_letter"))
        self._start = redis.register_script(script("member/start"))

    @property
    def read_sha(self) -> str:
        """The SHA1 of `read` (what a pipelined `EVALSHA` behind a wake-up read sends)."""
        return str(self._read.sha)

    def read_arguments(
        self, reads: Sequence[tuple[Entry, int]], known_tails: bool = False
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of `read` for `(shard, count)` pairs (with the shards' tails when
        `known_tails`: a shard with nothing past its tail is then not read at all)."""
        keys = [key for entry, _ in reads for key in (entry.key, owner_key(entry.key))]
        per_shard = [
            x
            for entry, count in reads
            for x in (count, entry.last_read, (entry.tail or "") if known_tails else "")
        ]
        return keys, [self.group, self.member_id, self.incarnation, self.member_id, *per_shard]

    async def read(self, reads: Sequence[tuple[Entry, int]]) -> list[ShardRead]:
        """New entries of several shards of one bundle, in one fenced call.

        Raises `RedisUnavailable` or `RedisCommandFailed` when the whole call failed; a shard's
        own refusal is in its `ShardRead`."""
        keys, args = self.read_arguments(reads)
        with redis_call(f"reading {', '.join(entry.key for entry, _ in reads)}"):
            reply = await self._eval(self._read, keys, args)
        return self.read_results(reads, reply)

    def read_results(self, reads: Sequence[tuple[Entry, int]], reply: Any) -> list[ShardRead]:
        """A `read` reply, per shard."""
        results = []
        for (entry, _), (refused, entries, tail) in zip(reads, reply, strict=True):
            if refused:
                results.append(ShardRead(refused=refusal(str(refused), f"shard {entry.key}")))
                continue
            messages = [
                Message(entry.index, entry.key, e[0], pairs(e[1]), 1, self.member_id) for e in entries or []
            ]
            results.append(ShardRead(messages, str(tail) if tail else None))
        return results

    async def claim(
        self, entry: Entry, min_idle_ms: int, count: int, cursor: str
    ) -> tuple[list[Message], str]:
        """Claim pending entries idle at least `min_idle_ms`, from `cursor`; and the next cursor
        (`0-0`: no more). Raises `Fenced`, `RedisUnavailable`, `RedisCommandFailed`."""
        reply = await self._call(self._claim, entry, [self.member_id, min_idle_ms, count, cursor])
        next_cursor, entries = str(reply[0]), reply[1] or []
        # Deleted entries come back empty (XAUTOCLAIM drops them from the PEL).
        return [self._claimed(entry, e) for e in entries if e[1] is not None], next_cursor

    async def claim_then_read(
        self, entry: Entry, count: int, cursor: str
    ) -> tuple[list[Message], str, ShardRead | None]:
        """`claim` of the backlog (min idle 0) from `cursor`, and once it is done, in the same
        call, up to `count` less those claimed new entries: the claimed entries, the next
        cursor, and what the read returned (None: the backlog is not done, nothing was read).
        Raises as `claim`."""
        reply = await self._call(self._claim, entry, [self.member_id, 0, count, cursor, "1"])
        next_cursor, entries = str(reply[0]), reply[1] or []
        claimed = [self._claimed(entry, e) for e in entries if e[1] is not None]
        if next_cursor != "0-0":
            return claimed, next_cursor, None
        fresh = [
            Message(entry.index, entry.key, e[0], pairs(e[1]), 1, self.member_id) for e in reply[2] or []
        ]
        tail = str(reply[3]) if reply[3] else None
        return claimed, next_cursor, ShardRead(fresh, tail)

    async def reclaim(self, entry: Entry, min_idle_ms: int, count: int) -> list[Message]:
        """Entries idle at least `min_idle_ms` under any consumer name, claimed here.
        Raises `Fenced`, `RedisUnavailable`, `RedisCommandFailed`."""
        reply = await self._call(self._reclaim, entry, [self.member_id, min_idle_ms, count])
        return [self._claimed(entry, e) for e in reply or [] if e[1] is not None]

    async def start(self, entry: Entry, message_id: str) -> int:
        """Count a delivery of a redelivered entry; its count, or 0 when it is no longer pending
        here. Raises `Fenced`, `RedisUnavailable`, `RedisCommandFailed`."""
        return int(await self._call(self._start, entry, [self.member_id, message_id]) or 0)

    async def ack(self, chunk: Sequence[tuple[Entry, Sequence[str]]]) -> list[int | RedisCommandFailed]:
        """One fenced XACK per shard, in one call: per shard the number acknowledged, or its
        refusal (`Fenced`, `RedisCommandFailed`). Raises `RedisUnavailable` or
        `RedisCommandFailed` when the whole call failed."""
        keys = [key for entry, _ in chunk for key in (entry.key, owner_key(entry.key))]
        counts = [len(ids) for _, ids in chunk]
        every_id = [entry_id for _, ids in chunk for entry_id in ids]
        with redis_call(f"acknowledging on {', '.join(entry.key for entry, _ in chunk)}"):
            replies = await self._eval(
                self._ack, keys, [self.group, self.member_id, self.incarnation, *counts, *every_id]
            )
        return [
            reply if isinstance(reply, int) else refusal(str(reply), f"acknowledging on {entry.key}")
            for (entry, _), reply in zip(chunk, replies, strict=True)
        ]

    async def dead_letter(self, entry: Entry, message: Message) -> None:
        """Move `message` to the shard's dead-letter stream and acknowledge it, at once.
        Raises `Fenced`, `RedisUnavailable`, `RedisCommandFailed`."""
        flat = [x for pair in message.fields.items() for x in pair]
        with redis_call(f"dead-lettering {message.key} {message.id}"):
            await self._eval(
                self._dead,
                [entry.key, owner_key(entry.key), dead_letter_key(entry.key)],
                [self.group, self.member_id, self.incarnation, message.id, message.deliveries, *flat],
            )

    async def _call(self, fenced_script: Any, entry: Entry, args: list[Any]) -> Any:
        with redis_call(f"shard {entry.key}"):
            return await self._eval(
                fenced_script,
                [entry.key, owner_key(entry.key)],
                [self.group, self.member_id, self.incarnation, *args],
            )

    async def _eval(self, fenced_script: Any, keys: list[str], args: list[Any]) -> Any:
        """One script call: its reply; an error reply raised as its coredis class."""
        lean = self.lean
        if lean is None:
            return await fenced_script(keys=keys, args=args)
        [reply] = await eval_scripts(lean, [(fenced_script, keys, args)])  # (reloads on NOSCRIPT)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _claimed(self, entry: Entry, raw: Any) -> Message:
        """A claimed entry (a redelivery: its count goes up when a handler starts on it)."""
        return Message(entry.index, entry.key, raw[0], pairs(raw[1]), int(raw[2]), self.member_id, True)

"""What the trio and the synchronous producer share: routing state, no I/O.

`ProducerState` holds the layout a producer routes with and the pause flag,
builds its heartbeat request and applies the answer. Both producers keep one
and differ only in how they wait and talk to Redis.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterable, Mapping, Sequence

import attrs
from prometheus_client import Counter

from rsc import lua
from rsc.client.coordinator import Backoff
from rsc.client.errors import RscError
from rsc.events.model import EMPTY_LAYOUT, ClientInfo, Layout
from rsc.events.routing import JUMP_V1, Router, jump, key_hash
from rsc.events.versions import IDEMPOTENCE_LEVEL, PROTOCOL_VERSION
from rsc.events.wire import (
    ProducerHeartbeatRequest,
    ProducerHeartbeatResponse,
    cap_key,
    producer_key,
    seal_key,
)
from rsc.redis_errors import TRANSIENT_CODES, reply_code

log = logging.getLogger("rsc.client.producer")

#: Appends Redis answered as repeats (idempotent producers: a call sent again after its reply
#: was lost, appended once), per stream; in prometheus_client's default registry, so that an
#: application's own `/metrics` (e.g. `prometheus_client.start_http_server`) shows them.
REPEATS = Counter(
    "rsc_producer_repeats",
    "Append calls Redis answered as repeats of an append already made (nothing appended again)",
    ["stream"],
)
#: The least time between two heartbeats a producer sends early to report full shards.
FULL_REPORT_GAP_S = 0.5
#: How many partition keys a producer remembers the shard of (the memo empties when full).
ROUTE_CACHE = 65_536
#: What a message's fields may hold (Redis stores every value as bytes).
Fields = Mapping[str, str | bytes | int | float]
#: A partition key: messages with the same key go to the same shard under one layout.
Key = bytes | str | None


def shard_full(stream_prefix: str, count: int, refusal: str) -> ShardFull:
    """The error for `count` messages a full shard kept refusing for the delivery timeout."""
    shard = refusal.split()[1] if len(refusal.split()) > 1 else "?"
    return ShardFull(
        f"publishing {count} message(s) to {stream_prefix!r}: shard {shard} stayed full (its "
        f"retention caps it with whenFull refuse; {refusal}); nothing of them was written there",
        shard,
    )


def held_back(stream_prefix: str, count: int, replies: Replies) -> PublishFailed | None:
    """What a publish that a full shard or a Redis out of memory held back raises once it gives
    up (None: neither held it back). Both clear by themselves (the groups consume, retention
    trims): the producer backs off and tries again until its delivery timeout."""
    if replies.full is not None:
        return shard_full(stream_prefix, count, replies.full)
    if replies.oom is not None:
        return RedisOutOfMemory(
            f"publishing {count} message(s) to {stream_prefix!r}: Redis stayed out of memory "
            f"({replies.oom}); nothing of them was written there"
        )
    return None


def publish_failed(stream_prefix: str, count: int, cause: BaseException) -> PublishFailed:
    """The error for a pipeline of `count` messages that Redis did not take whole."""
    return PublishFailed(
        f"publishing {count} message(s) to {stream_prefix!r} failed ({cause}); "
        "some may have been written: a retry may duplicate them"
    )


@attrs.define
class DeliveryRetries:
    """When to try a publish again while Redis is unavailable, within `timeout_s` of the first
    try (Kafka's `delivery.timeout.ms`); times are the caller's monotonic clock."""

    started: float
    timeout_s: float
    backoff: Backoff = Backoff(base_s=0.05, cap_s=1.0)
    attempts: int = 0
    rng: random.Random = attrs.field(factory=random.Random)

    def next_wait(self, now: float) -> float | None:
        """Seconds to wait before the next try (the last one at the timeout); None after it."""
        left = self.started + self.timeout_s - now
        if left <= 0:
            return None
        self.attempts += 1
        return min(left, self.backoff.delay(min(self.attempts - 1, 16), self.rng))


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
            if why == "UNAVAILABLE":
                out.unavailable = str(result)
        else:
            out.failure = why
            return out
    return out


class Publish:
    """One `publish_many` of a producer, across its tries (both producers drive it).

    Idempotent (the producer has an epoch), its messages get their sequences when it begins
    and keep them on every try. A call whose answer did not come (the connection failed) is
    sent again as it is, to the same shard, so that the shard answers a repeat with the ids it
    gave; one refused before anything was appended (full, busy, script unknown) likewise; only
    the messages of a call refused as SEALED (nothing appended, and a late copy is refused by
    the seal too) are routed again, with the layout a heartbeat brings."""

    def __init__(self, state: ProducerState, messages: Sequence[tuple[Fields, Key]]) -> None:
        self.state = state
        self.messages = messages
        self.ids: list[str | None] = [None] * len(messages)
        self.ident = state.begin(len(messages))
        self._calls: list[Append] = []
        self._route: list[int] = list(range(len(messages)))

    @property
    def pending(self) -> bool:
        """Whether some message is still to be appended."""
        return bool(self._calls or self._route)

    def calls(self) -> list[Append]:
        """The calls of the next try: those to send again as they are, and the messages to
        route (with the current layout; raises as `ProducerState.shard_key`)."""
        if self._route:
            routed = [(i, self.state.shard_key(self.messages[i][1])) for i in self._route]
            self._calls += appends(routed, self.messages, self.ident)
            self._route = []
        low = self.state.floor()
        for call in self._calls:
            call.low = low
        return self._calls

    def take(self, results: Sequence[object]) -> Replies:
        """Note the answers to the calls of this try (`calls()`); what is left, and why."""
        replies = take_replies(self._calls, results, self.ids)
        if replies.failure is None and replies.fenced is None:
            self._calls, self._route = replies.resend, replies.reroute
            if replies.repeats:
                self.state.repeats += replies.repeats
                REPEATS.labels(self.state.stream_prefix).inc(replies.repeats)
        return replies

    def done(self) -> list[str]:
        """The ids written, in order (each message once)."""
        written = [i for i in self.ids if i is not None]
        self.state.published += len(written)
        return written

    def close(self) -> None:
        """The publish ended (returned or raised): its sequences no longer hold the floor."""
        self.state.end(self.ident)


class NoWritableShards(RscError):
    """The stream has no ACTIVE shard (scaled in to 0): nothing can be published until it is
    scaled out again. Nothing was published."""


class UnsupportedRouting(RscError):
    """The stream's layout uses a routing protocol this client does not implement."""


class PublishFailed(RscError):
    """Redis refused or could not take a publish; some of its messages may have been written.

    At-least-once: retrying the same messages may write some of them twice.
    """


class ShardFull(PublishFailed):
    """A shard stayed at its entry cap (the stream's retention: `maxEntriesPerShard` with
    `whenFull: refuse`) for `delivery_timeout_s`: the messages routed there were not written
    (the others of the publish were, once). `shard` is the shard key. Room comes as the
    stream's groups acknowledge and retention trims, or from an operator."""

    def __init__(self, message: str, shard: str) -> None:
        super().__init__(message)
        self.shard = shard


class RedisOutOfMemory(PublishFailed):
    """Redis refused the messages with `OOM` (its used memory is above `maxmemory`) for
    `delivery_timeout_s`: they were not written. Memory comes back as groups consume and the
    streams' retention trims, or with a larger Redis (docs/operations.md, Retention and memory)."""


class ProducerFenced(PublishFailed):
    """Another process registered this producer's id (a restart of it, or a second copy): this
    one's epoch is fenced, by the coordinator and on every shard the newer one wrote. It must
    stop; nothing more it publishes is written."""


class ProducerPaused(RscError):
    """The stream stayed paused longer than the producer's `pause_timeout_s`."""


@attrs.define
class Change:
    """What one heartbeat answer changed: the producer wakes or blocks publishers on it."""

    layout: bool = False
    paused: bool = False
    resumed: bool = False


class ProducerState:
    """The layout a producer routes with, its pause flag and its in-flight count."""

    def __init__(self, stream_prefix: str, producer_id: str, client: ClientInfo) -> None:
        self.stream_prefix = stream_prefix
        self.producer_id = producer_id
        self.client = client
        self.layout: Layout = EMPTY_LAYOUT
        self.router = Router(EMPTY_LAYOUT)
        #: A routing protocol the coordinator switched to that this client does not know.
        self.unsupported: str | None = None
        #: Partition key -> shard key under `layout` (keys repeat: hashing each once is enough).
        self._routes: dict[bytes | str, str] = {}
        self.paused = False
        self.known = False
        self.interval_s = 3.0
        self.in_flight = 0
        self.published = 0
        self._round_robin = itertools.count()
        #: Indexes of shards that refused appends as full, for the next heartbeat to report.
        self.full: set[int] = set()
        #: When a heartbeat last went early to report them (the caller's monotonic clock).
        self._full_reported_s: float | None = None
        #: Idempotence (feature level 6): asked for (the producer's setting), the epoch the
        #: coordinator gave (None: none yet, or an older coordinator), the next sequence, the
        #: first sequences of the publishes in flight, and how many repeats Redis dropped.
        self.idempotent = True
        self.epoch: int | None = None
        self.fenced: str | None = None
        self.window_ms = int(MIN_WINDOW_S * 1000)
        self._next_seq = 1
        self._open: dict[int, int] = {}
        self.repeats = 0

    def request(self, *, leave: bool = False) -> ProducerHeartbeatRequest:
        """The next heartbeat: the version routed with, and `quiesced` once paused and idle."""
        return ProducerHeartbeatRequest(
            protocol_version=PROTOCOL_VERSION,
            stream_prefix=self.stream_prefix,
            producer_id=self.producer_id,
            metadata_version=self.layout.metadata_version,
            quiesced=self.paused and self.in_flight == 0,
            client=self.client,
            leave=leave,
            full_shards=frozenset(self.full),
            producer_epoch=(self.epoch or 0) if self.idempotent else None,
        )

    def fence(self, why: str) -> ProducerFenced:
        """Another process took this producer's id over: it publishes nothing more."""
        if self.fenced is None:
            log.error("%s: fenced, publishing nothing more: %s", self.producer_id, why)
        self.fenced = why
        return self.fenced_error()

    def fenced_error(self) -> ProducerFenced:
        """What a publish raises once the producer is fenced."""
        return ProducerFenced(
            f"producer {self.producer_id!r} of {self.stream_prefix!r} is fenced (another process "
            f"registered its id): {self.fenced}; nothing was published"
        )

    def begin(self, count: int) -> Ident:
        """A publish of `count` messages begins: their sequences (when idempotent)."""
        first = self._next_seq
        self._next_seq += count
        self._open[first] = self._open.get(first, 0) + 1
        return Ident(self.producer_id, self.epoch if self.idempotent else None, first, self.window_ms)

    def end(self, ident: Ident) -> None:
        """The publish that began with `ident` ended."""
        left = self._open.get(ident.first, 0) - 1
        if left > 0:
            self._open[ident.first] = left
        else:
            self._open.pop(ident.first, None)

    def floor(self) -> int:
        """The lowest sequence a publish in flight holds (else the next one): every call of a
        lower first sequence has been answered, so Redis may forget it."""
        return min(self._open, default=self._next_seq)

    def sent(self, request: ProducerHeartbeatRequest) -> None:
        """`request` was answered: the full shards it reported are reported."""
        self.full -= request.full_shards

    def note_full(self, targets: Iterable[str], now_s: float) -> bool:
        """Shard keys refused appends as full: report them. True when a heartbeat should go
        now (at most one every `FULL_REPORT_GAP_S`), so the coordinator trims them early."""
        index = {shard.key: shard.index for shard in self.layout.shards}
        self.full.update(index[t] for t in targets if t in index)
        last = self._full_reported_s
        if not self.full or (last is not None and now_s - last < FULL_REPORT_GAP_S):
            return False
        self._full_reported_s = now_s
        return True

    def apply(self, response: ProducerHeartbeatResponse) -> Change:
        """Take the answer's interval, layout (when sent), pause flag and producer epoch."""
        change = Change()
        if self.idempotent and response.producer_epoch is not None and response.producer_epoch != self.epoch:
            if self.epoch is not None:
                log.warning(
                    "%s: the coordinator gave producer epoch %s (it held %s)",
                    self.producer_id,
                    response.producer_epoch,
                    self.epoch,
                )
            self.epoch = response.producer_epoch
        elif self.idempotent and response.producer_epoch is None and not self.known:
            log.info(
                "%s: the coordinator gives no producer epoch (feature level below %d, or an older "
                "release): publishing without idempotence (a retry may append a message twice)",
                self.producer_id,
                IDEMPOTENCE_LEVEL,
            )
        self.interval_s = response.heartbeat_interval_ms / 1000
        layout = response.layout
        if layout is not None and layout.routing != JUMP_V1:
            if self.unsupported != layout.routing:
                log.error(
                    "%s: the stream routes with %r; this client knows only %r: upgrade rsc",
                    self.producer_id,
                    layout.routing,
                    JUMP_V1,
                )
            self.unsupported = layout.routing
        elif layout is not None and layout.metadata_version != self.layout.metadata_version:
            log.info("%s: routing with layout v%s", self.producer_id, layout.metadata_version)
            self.layout, self.router, self._routes = layout, Router(layout), {}
            self.unsupported = None
            change.layout = True
        self.known = True
        if response.paused != self.paused:
            self.paused = response.paused
            change.paused, change.resumed = response.paused, not response.paused
        return change

    def shard_key(self, key: Key) -> str:
        """The Redis key a message with `key` goes to now (keyless: round robin over ACTIVE shards).

        Raises `UnsupportedRouting` when the stream routes with a protocol this client does not
        know (even for a key routed before), `NoWritableShards` when it has no ACTIVE shard."""
        if self.unsupported is not None:
            raise UnsupportedRouting(
                f"stream {self.stream_prefix!r} routes with {self.unsupported!r}; this client knows only "
                f"{JUMP_V1!r}: upgrade rsc (nothing was published)"
            )
        if key is not None and (cached := self._routes.get(key)) is not None:
            return cached
        active = self.router.active
        if not active:
            raise NoWritableShards(
                f"stream {self.stream_prefix!r} has no ACTIVE shard (scaled in to 0): nothing was published"
            )
        if key is None:
            return active[next(self._round_robin) % len(active)].key
        shard = active[jump(key_hash(key.encode() if isinstance(key, str) else key), len(active))].key
        if len(self._routes) >= ROUTE_CACHE:
            self._routes.clear()
        self._routes[key] = shard
        return shard

    def targets(self, messages: Iterable[tuple[Fields, Key]]) -> list[tuple[str, Fields]]:
        """Each message with the shard key it goes to, in order. Raises as `shard_key`."""
        return [(self.shard_key(key), fields) for fields, key in messages]


class RoutingView:
    """What both producers show of their `ProducerState`."""

    state: ProducerState

    @property
    def stream_prefix(self) -> str:
        return self.state.stream_prefix

    @property
    def producer_id(self) -> str:
        return self.state.producer_id

    @property
    def layout(self) -> Layout:
        """The layout this producer routes with now."""
        return self.state.layout

    @property
    def paused(self) -> bool:
        return self.state.paused

    @property
    def published(self) -> int:
        """Messages this producer has appended."""
        return self.state.published

    @property
    def repeats(self) -> int:
        """Append calls Redis answered as repeats (sent again after a lost reply; nothing was
        appended twice); also `rsc_producer_repeats_total{stream}` in prometheus_client's
        default registry."""
        return self.state.repeats

    def shard_key(self, key: Key) -> str:
        """The Redis key a message with `key` goes to under the current layout.

        Raises `UnsupportedRouting` (a routing protocol this client does not know) or
        `NoWritableShards` (no ACTIVE shard), as `ProducerState.shard_key`."""
        return self.state.shard_key(key)

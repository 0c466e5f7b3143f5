"""What the trio and the synchronous producer share: routing state, no I/O.

`ProducerState` holds the layout a producer routes with and the pause flag,
builds its heartbeat request and applies the answer. Both producers keep one
and differ only in how they wait and talk to Redis.
"""

from __future__ import annotations

import itertools
import logging
import random
import warnings
from collections.abc import Iterable, Sequence

import attrs
from prometheus_client import Counter

from rsc.client import append_calls
from rsc.client.append_calls import (
    MIN_WINDOW_S,
    Append,
    Fields,
    Ident,
    Key,
    Replies,
    appends,
    take_replies,
)
from rsc.client.coordinator import Backoff
from rsc.client.errors import RscError
from rsc.events.model import EMPTY_LAYOUT, ClientInfo, Layout
from rsc.events.routing import JUMP_V1, Router, jump, key_hash
from rsc.events.versions import IDEMPOTENCE_LEVEL, PROTOCOL_VERSION
from rsc.events.wire import (
    ProducerHeartbeatRequest,
    ProducerHeartbeatResponse,
)

log = logging.getLogger("rsc.client.producer")

#: Names that moved to `rsc.client.append_calls` (0.2.0): still importable from here, with a
#: DeprecationWarning, for one minor release.
_MOVED = frozenset(
    {"SEALED_APPEND", "SEALED_APPEND_SHA", "Arg", "entry_ids", "refusal", "appends", "take_replies"}
)


def __getattr__(name: str) -> object:
    if name in _MOVED:
        warnings.warn(
            f"rsc.client.producer_state.{name} moved to rsc.client.append_calls",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(append_calls, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

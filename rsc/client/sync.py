"""The synchronous producer, for redis-py applications (`pip install 'rsc[sync]'`).

Same semantics as the trio `Producer`: it registers by producer heartbeat,
acknowledging the layout version it routes with, and follows a new layout
at once; keys route with `jump-v1`, keyless messages round robin; while the
stream is paused `publish` blocks up to `pause_timeout_s`, then raises
`ProducerPaused`; while Redis cannot answer, `publish` retries for up to
`delivery_timeout_s` (30 s), then raises `PublishFailed`. The heartbeats run
in a background thread; `publish` and `publish_many` are safe to call from
several threads.

    with SyncProducer(SyncCoordinator("http://127.0.0.1:8080"), redis.Redis(), "orders") as producer:
        producer.publish({"amount": "12"}, key="customer-7")
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx

try:
    import redis
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the synchronous producer needs redis-py: pip install 'rsc[sync]'") from exc

from rsc import tracing
from rsc.client.append_calls import (
    MIN_WINDOW_S,
    SEALED_APPEND,
    Append,
    Fields,
    Key,
    Replies,
)
from rsc.client.coordinator import (
    AGAIN,
    Backoff,
    Failover,
    Negotiation,
    Retry,
    describe,
    http_options,
    settle,
    structure,
)
from rsc.client.errors import REFUSED_FOR_GOOD, CoordinatorRejected, CoordinatorUnavailable, RscError
from rsc.client.member import CLIENT
from rsc.client.producer_state import (
    DeliveryRetries,
    NoWritableShards,
    ProducerPaused,
    ProducerState,
    Publish,
    PublishFailed,
    RedisOutOfMemory,
    RoutingView,
    ShardFull,
    UnsupportedRouting,
    held_back,
    publish_failed,
)
from rsc.connect import DEFAULT_REDIS_URL, is_sentinel_url
from rsc.events import codec
from rsc.events.wire import ProducerHeartbeatRequest, ProducerHeartbeatResponse
from rsc.outage import OutageLog
from rsc.redis_errors import TRANSIENT_CODES, reply_code
from rsc.scripts import reloading_sync
from rsc.sync_connect import sync_redis

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:  # rsc[sync] brings it: commands packed in C (redis-py's own packing encodes each argument)
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - depends on the installation
    _pack_command = None

__all__ = [
    "Fields",
    "Key",
    "NoWritableShards",
    "ProducerPaused",
    "PublishFailed",
    "RedisOutOfMemory",
    "ShardFull",
    "UnsupportedRouting",
    "SyncCoordinator",
    "SyncProducer",
]

log = logging.getLogger("rsc.client.producer")

#: What a failed pipeline raises: Redis refused a command, or the connection failed, or (on a
#: cluster) redis-py found no node to send it to: its cluster errors are no `RedisError`.
REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)
#: Of those, the failures of a Redis that may answer if asked again (as `rsc.redis_errors.UNAVAILABLE`).
REDIS_UNAVAILABLE = (
    redis.exceptions.ConnectionError,  # BusyLoadingError (LOADING) too
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.MasterDownError,
    OSError,
)
#: redis-py's cluster errors that are a client's mistake, not the cluster's state: retrying
#: cannot help. Its other `RedisClusterException`s (`RedisClusterUnreachableError`: no node
#: answered a topology refresh; `SlotNotCoveredError`; "not all slots are covered") say that the
#: cluster cannot serve the keys now, as during a failover or a restart of its nodes.
CLUSTER_MISUSE = (redis.exceptions.CrossSlotTransactionError, redis.exceptions.InvalidPipelineStack)
#: A credential Redis refused: retrying will not help (redis-py makes them `ConnectionError`s).
REFUSED_CREDENTIALS = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)


def _unavailable(exc: BaseException) -> bool:
    """Worth retrying: Redis could not answer now (not a wrong password, not a refusal)."""
    if _credential_refused(exc):
        return False
    if isinstance(exc, redis.exceptions.RedisClusterException):
        return not isinstance(exc, CLUSTER_MISUSE)
    if isinstance(exc, REDIS_UNAVAILABLE):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and reply_code(exc) in TRANSIENT_CODES


def _credential_refused(exc: BaseException) -> bool:
    """`exc` is, or was raised from (a cluster's topology refresh), a refused credential."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, REFUSED_CREDENTIALS):
            return True
        seen = seen.__cause__
    return False


class SyncCoordinator:
    """The blocking twin of `Coordinator` for producers: the same retries, error mapping and
    credentials (`token`, `ca_bundle`; defaults `RSC_TOKEN`, `RSC_CA_BUNDLE`).

    Constructing raises as `Coordinator` does: `ValueError` (no URL, or one that is malformed,
    not `http://` or `https://`, or without a host), `CoordinatorUnavailable` (a CA bundle it
    cannot read), each naming the URL or file and what is wrong."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff: Backoff | None = None,
        transport: httpx.BaseTransport | None = None,
        rng: random.Random | None = None,
        token: str | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        self.retries = retries
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        #: Several coordinators: the same failover as `Coordinator` (a list or "url1,url2").
        self.failover = Failover(base_url)
        self.negotiation = Negotiation()
        self.http = httpx.Client(
            base_url=self.failover.urls[0],
            timeout=timeout_s,
            follow_redirects=True,
            transport=transport,
            **http_options(token, ca_bundle),
        )

    def __enter__(self) -> SyncCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def producer_heartbeat(self, request: ProducerHeartbeatRequest) -> ProducerHeartbeatResponse:
        """One producer heartbeat (`POST /v1/producers/heartbeat`), blocking.

        Raises `CoordinatorUnavailable` when no coordinator answered (transport error, timeout,
        502/503/504) in `retries` more attempts, every URL tried at least once;
        `CoordinatorUnintelligible` at once for a 2xx answer it cannot read; `CoordinatorRejected`
        at once for any other 4xx/5xx."""
        data = self._send("POST", "/v1/producers/heartbeat", codec.wire.unstructure(request))
        return structure(data, ProducerHeartbeatResponse)

    def routing(self, stream_prefix: str) -> dict[str, Any]:
        """Routing metadata without registering (`GET /v1/streams/{p}/routing`).

        Raises as `producer_heartbeat` (`CoordinatorUnintelligible` only for an answer that is
        not JSON: its shape is not checked)."""
        data: dict[str, Any] = self._send("GET", f"/v1/streams/{stream_prefix}/routing", None)
        return data

    def _send(self, method: str, path: str, body: Any) -> Any:
        last: Exception | None = None
        for wait, index in self.failover.attempts(self.retries, self.backoff, self.rng):
            if wait:
                time.sleep(wait)
            while True:
                try:
                    sent = self.negotiation.stamp(body)
                    response = self.http.request(method, self.failover.urls[index] + path, json=sent)
                except httpx.HTTPError as exc:
                    last = exc
                    self.failover.failed(index)
                    break
                try:
                    data = settle(method, path, response, sent, self, index)
                except Retry as retry:
                    last = retry.rejection
                    break
                if data is not AGAIN:
                    return data
        raise CoordinatorUnavailable(f"{method} {path}: {describe(last)}") from last


def send_appends(client: Any, calls: Sequence[Append]) -> list[Any]:
    """Send the append scripts `calls`, one reply per call in order (an error reply as its
    exception, as `pipeline.execute(raise_on_error=False)` gives them).

    On a standalone `redis.Redis` with hiredis installed, each call is packed by hiredis and
    written as soon as it is packed on one pooled connection (Redis runs the first while the
    next is packed), then the replies are read; elsewhere (a
    `RedisCluster`, or no hiredis) through a redis-py pipeline. Raises what redis-py raises
    for a connection that fails (the connection is then dropped, never reused half-read)."""
    if _pack_command is None or type(client) is not redis.Redis:
        pipe = client.pipeline(transaction=False)
        for call in calls:
            # (redis-py's cluster pipeline blocks its evalsha method, not the command)
            pipe.execute_command(*call.command())
        results: list[Any] = pipe.execute(raise_on_error=False)
        return results
    pool = client.connection_pool
    connection: Any = pool.get_connection()  # (redis-py leaves its Connection methods untyped)
    replies: list[Any] = []
    try:
        for call in calls:
            connection.send_packed_command((_pack_command(call.command()),))
        for _ in calls:
            try:
                replies.append(connection.read_response())
            except redis.exceptions.ResponseError as refused:  # this call's error reply
                replies.append(refused)
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)
    return replies


class SyncProducer(RoutingView):
    """Publishes to one logical stream through a redis-py client (`Redis` or `RedisCluster`).

    `start()` (or entering the `with` block) registers and returns once the
    layout is known; `close()` flushes, stops the heartbeat thread and leaves.
    """

    def __init__(
        self,
        coordinator: SyncCoordinator,
        redis: Any,
        stream_prefix: str,
        producer_id: str | None = None,
        *,
        pause_timeout_s: float = 30.0,
        start_timeout_s: float = 10.0,
        delivery_timeout_s: float = 30.0,
        idempotent: bool = True,
    ) -> None:
        self.coordinator = coordinator
        self.redis = redis
        self.pause_timeout_s = pause_timeout_s
        #: How long a publish retries while Redis is unavailable before `PublishFailed`.
        self.delivery_timeout_s = delivery_timeout_s
        self.start_timeout_s = start_timeout_s
        self.state = ProducerState(stream_prefix, producer_id or f"producer/{uuid.uuid4().hex[:12]}", CLIENT)
        #: Idempotence (feature level 6): each message appended once however often it is sent
        #: again, within a window of twice the delivery timeout (at least 2 minutes).
        self.state.idempotent = idempotent
        self.state.window_ms = int(max(MIN_WINDOW_S, 2 * delivery_timeout_s) * 1000)
        #: Outages of Redis (publishes retried) and of the coordinator (heartbeats failing):
        #: one line when each begins and one when it ends, not a line per retry.
        self.redis_outage = OutageLog(log, f"{self.producer_id}: Redis")
        #: Heartbeats, one at a time (the next one is built from the answer to the last).
        self._beating = threading.Lock()
        #: Layout refreshes, one at a time (those waiting use the layout the first one learnt).
        self._refreshing = threading.Lock()
        self.coordinator_outage = OutageLog(
            log, f"{self.producer_id}: producer heartbeats", down="fail", up="succeed again"
        )
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._ready = threading.Event()
        #: Set (and the thread ended) when the coordinator refused the credential before registering.
        self._refused: CoordinatorRejected | None = None
        self._resumed = threading.Event()
        self._resumed.set()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SyncProducer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> SyncProducer:
        """Start the heartbeat thread; return once registered, or raise `CoordinatorUnavailable`.

        `CoordinatorUnavailable` when no layout came within `start_timeout_s` (other refusals,
        such as 404 `UNKNOWN_STREAM`, are only logged until then); `CoordinatorRejected` as soon
        as the coordinator refuses the credential (401/403). Either way the producer is closed."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._heartbeats, name=f"rsc-producer {self.producer_id}", daemon=True
            )
            self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._ready.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
            if self._refused is not None:
                self.close()
                raise self._refused  # a wrong or insufficient credential: waiting will not help
            if time.monotonic() >= deadline:
                self.close()
                raise CoordinatorUnavailable(
                    f"producer {self.producer_id!r} got no layout within {self.start_timeout_s} s"
                )
        return self

    def heartbeat(self) -> None:
        """One producer heartbeat: acknowledge the routed version, learn layout and pause state.

        Raises as `SyncCoordinator.producer_heartbeat`: `CoordinatorUnavailable`,
        `CoordinatorUnintelligible`, `CoordinatorRejected`."""
        with self._beating:  # one at a time: a new process asks for its epoch once
            with self._lock:
                request = self.state.request()
            try:
                response = self.coordinator.producer_heartbeat(request)
            except CoordinatorRejected as exc:
                if exc.code == "PRODUCER_FENCED":  # another process registered our id since
                    with self._lock:
                        self.state.fence(exc.message)
                raise
            with self._lock:
                change = self.state.apply(response)
                self.state.sent(request)
        self._ready.set()
        if change.paused:
            self._resumed.clear()
        elif change.resumed:
            self._resumed.set()

    def publish(self, fields: Fields, key: Key = None) -> str:
        """Append one message to its shard; returns the entry id. Raises as `publish_many`."""
        return self.publish_many([(fields, key)])[0]

    def publish_many(self, messages: Sequence[tuple[Fields, Key]]) -> list[str]:
        """Append several messages in one pipeline; ids in order.

        As the trio producer: each through `SEALED_APPEND`; one refused by a seal is routed
        again with the layout a heartbeat brings; `NoWritableShards` with no ACTIVE shard.

        Raises `RscError` before `start` and after `close`; `ProducerPaused` when the stream stays
        paused past `pause_timeout_s`; `UnsupportedRouting` or `NoWritableShards` before sending;
        `PublishFailed` at once when Redis refuses a command, the credential or the script reload,
        else once Redis stayed unavailable (or a sealed shard got no new layout) for
        `delivery_timeout_s`, or `close` began. Unavailable includes a script reload Redis could
        not answer and redis-py's cluster errors that are no `RedisError`
        (`RedisClusterUnreachableError`, `SlotNotCoveredError`)."""
        self._wait_until_open()
        with tracing.send_span(self.stream_prefix, len(messages)) as carried:
            if carried:  # each message carries the send span's context (rsc:traceparent)
                messages = [(tracing.with_context(fields, carried), key) for fields, key in messages]
            ids = self._publish(messages)
            tracing.set_message_id(ids)
            return ids

    def _publish(self, messages: Sequence[tuple[Fields, Key]]) -> list[str]:
        with self._lock:
            self.state.in_flight += 1
            publish = Publish(self.state, messages)
        try:
            retries = DeliveryRetries(time.monotonic(), self.delivery_timeout_s)
            while publish.pending:
                with self._lock:  # not answered: sent again as they were; the sealed ones routed again
                    if self.state.fenced is not None:  # a heartbeat learnt it meanwhile
                        raise self.state.fenced_error()
                    calls = publish.calls()
                todo = [p for call in calls for p in call.positions]
                try:
                    results = reloading_sync(  # NOSCRIPT (a restarted or new node): loaded, sent again
                        calls,
                        lambda each: send_appends(self.redis, each),
                        lambda _: self.redis.script_load(SEALED_APPEND),
                    )
                    self.redis_outage.ok()
                    replies = self._written(publish, results)
                except REDIS_ERRORS as exc:
                    if not _unavailable(exc):
                        raise publish_failed(self.stream_prefix, len(todo), exc) from exc
                    self._retry_later(retries, len(todo), exc, redis_down=True)
                    continue
                if replies.unavailable:  # a node loading, read-only, busy: as when it does not answer
                    self._retry_later(retries, len(todo), RscError(replies.unavailable), redis_down=True)
                elif replies.sealed:
                    self._refresh_layout(retries, len(todo))
                elif (held := held_back(self.stream_prefix, len(todo), replies)) is not None:
                    self._report_full(replies.full_targets)
                    self._retry_later(retries, len(todo), held, give_up=held)  # room comes: back off
            with self._lock:
                return publish.done()
        finally:
            with self._lock:
                publish.close()
                self.state.in_flight -= 1
                if not self.state.in_flight:
                    self._idle.notify_all()

    def _written(self, publish: Publish, results: Sequence[object]) -> Replies:
        """Note the ids written; what is to be sent again, and why.

        Raises `ProducerFenced` when a shard refused this producer's epoch, `PublishFailed` when
        Redis refused a call for another reason than a seal or an unknown script (some of its
        messages may have been written)."""
        with self._lock:
            replies = publish.take(results)
            if replies.fenced is not None:
                raise self.state.fence(replies.fenced)
        if replies.failure is not None:
            raise publish_failed(self.stream_prefix, len(publish.ids), RscError(replies.failure))
        return replies

    def _report_full(self, targets: list[str]) -> None:
        """Shards refused appends as full: tell the coordinator now (a heartbeat, at most one
        every `FULL_REPORT_GAP_S`), so that it trims them before its next retention round."""
        with self._lock:
            now = self.state.note_full(targets, time.monotonic())
        if not now:
            return
        with self._refreshing:
            try:
                self.heartbeat()
            except (CoordinatorUnavailable, CoordinatorRejected) as exc:
                log.debug("%s: could not report full shards: %s", self.producer_id, exc)

    def _refresh_layout(self, retries: DeliveryRetries, count: int) -> None:
        """A shard was sealed under us: learn the new layout now (a heartbeat), or wait a little."""
        before = self.state.layout.metadata_version
        with self._refreshing:  # one heartbeat for every publish that met the seal
            if self.state.layout.metadata_version == before:
                try:
                    self.heartbeat()
                except CoordinatorUnavailable as exc:
                    self.coordinator_outage.failed(f"refreshing the layout: {exc}")
                except CoordinatorRejected as exc:
                    log.warning("%s: could not refresh the layout: %s", self.producer_id, exc)
        if self.state.layout.metadata_version == before:
            self._retry_later(retries, count, RscError("the shard is sealed and no new layout came"))

    def _retry_later(
        self,
        retries: DeliveryRetries,
        count: int,
        exc: Exception,
        redis_down: bool = False,
        give_up: PublishFailed | None = None,
    ) -> None:
        """Wait before the next try; raises `give_up` (else `PublishFailed`) past the timeout."""
        wait = retries.next_wait(time.monotonic())
        if wait is None or self._closing.is_set():
            raise (give_up or publish_failed(self.stream_prefix, count, exc)) from exc
        if redis_down:  # one line per outage, not per publish
            self.redis_outage.failed(exc)
        elif retries.attempts == 1:
            log.warning("%s: publish not taken yet, retrying: %s", self.producer_id, exc)
        time.sleep(wait)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until no publish of this producer is in flight; False if `timeout_s` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self.state.in_flight == 0, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop heartbeating, wait for publishes in flight (up to `timeout_s`), then leave."""
        if self._closing.is_set():
            return
        self._closing.set()
        self.flush(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._ready.is_set():
            try:
                with self._lock:
                    request = self.state.request(leave=True)
                self.coordinator.producer_heartbeat(request)
            except (CoordinatorUnavailable, CoordinatorRejected) as exc:
                log.warning("%s: could not leave (the lease will expire): %s", self.producer_id, exc)

    def _heartbeats(self) -> None:
        while not self._closing.is_set():
            try:
                self.heartbeat()
            except CoordinatorRejected as exc:
                if exc.code == "PRODUCER_FENCED":  # another process has our id: stop
                    return
                if not self._ready.is_set() and exc.status in REFUSED_FOR_GOOD:
                    self._refused = exc
                    return
                log.warning("%s: producer heartbeat refused: %s", self.producer_id, exc)
            except CoordinatorUnavailable as exc:
                self.coordinator_outage.failed(exc)
            else:
                self.coordinator_outage.ok()
            self._closing.wait(self.state.interval_s if self._ready.is_set() else 0.5)

    def _wait_until_open(self) -> None:
        if self._closing.is_set():
            raise RscError(f"producer {self.producer_id!r} is closed")
        if self.state.fenced is not None:
            raise self.state.fenced_error()
        if not self._ready.is_set():
            raise RscError(f"producer {self.producer_id!r} is not started (call start() or use `with`)")
        if not self._resumed.wait(self.pause_timeout_s):
            raise ProducerPaused(f"stream {self.stream_prefix!r} stayed paused for {self.pause_timeout_s} s")


@contextlib.contextmanager
def connect_sync_producer(
    stream_prefix: str,
    producer_id: str | None = None,
    *,
    coordinator_url: str | Sequence[str] | None = None,
    redis_url: str | None = None,
    token: str | None = None,
    **settings: Any,
) -> Iterator[SyncProducer]:
    """A started `SyncProducer` from URLs, in one call; closed (and its clients) at the end:

        with connect_sync_producer("orders") as producer:
            producer.publish({"id": "1"}, "customer-7")

    The URLs and the token default as `rsc.connect_producer`'s; a Redis Cluster node is noticed
    (a `RedisCluster` client); `settings` go to `SyncProducer`. Raises as `SyncProducer.start`."""
    url = coordinator_url or os.environ.get("RSC_COORDINATOR_URL") or "http://127.0.0.1:8080"
    target = redis_url or os.environ.get("RSC_REDIS_URL") or DEFAULT_REDIS_URL
    with (
        SyncCoordinator(url, token=token) as coordinator,
        contextlib.closing(_sync_client(target)) as redis,
        SyncProducer(coordinator, redis, stream_prefix, producer_id, **settings) as producer,
    ):
        yield producer


def _sync_client(url: str) -> Any:
    """A redis-py client for `url`: a `RedisCluster` when the node says it is one."""
    client = sync_redis(url)
    if not is_sentinel_url(url) and client.info("cluster").get("cluster_enabled"):
        client.close()
        return redis.RedisCluster.from_url(url)
    return client

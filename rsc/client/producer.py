"""The trio producer: routes by partition key with the coordinator's layout (`jump-v1`).

* It registers through `POST /v1/producers/heartbeat` and heartbeats at the
  interval it is given, acknowledging the layout version it routes with; a
  new version in an answer switches its routing at once (online scale-out).
* `publish(fields, key=...)` appends to the key's shard; without a key,
  messages go round robin over the ACTIVE shards. `publish_many` pipelines.
* While the stream is paused, `publish` waits up to `pause_timeout_s` for a
  resume, then raises `ProducerPaused`; meanwhile the producer reports
  `quiesced` once nothing of its own is in flight.
* Redis outages: while Redis cannot answer (connection lost, restarting, failing
  over), `publish` blocks and retries with backoff for up to `delivery_timeout_s`
  (30 s), then raises `PublishFailed`; a command Redis refuses fails at once.
* At-least-once: a publish that failed may be retried by the caller; across
  a scale-out, messages of one key may be split between two shards (see
  docs/producers.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio

from rsc import tracing
from rsc.client.append_calls import (
    MIN_WINDOW_S,
    SEALED_APPEND,
    SEALED_APPEND_SHA,
    Append,
    Fields,
    Key,
    Replies,
)
from rsc.client.append_writer import AppendWriter
from rsc.client.coordinator import Coordinator
from rsc.client.errors import (
    REFUSED_FOR_GOOD,
    CoordinatorRejected,
    CoordinatorUnavailable,
    RedisCommandFailed,
    RedisUnavailable,
    RscError,
)
from rsc.client.member import CLIENT
from rsc.client.producer_state import (
    DeliveryRetries,
    NoWritableShards,
    ProducerFenced,
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
from rsc.client.redis_calls import redis_call
from rsc.connect import DEFAULT_REDIS_URL, open_redis
from rsc.outage import OutageLog
from rsc.scripts import reloading

__all__ = [
    "Fields",
    "NoWritableShards",
    "Key",
    "Producer",
    "ProducerFenced",
    "ProducerPaused",
    "PublishFailed",
    "RedisOutOfMemory",
    "ShardFull",
    "UnsupportedRouting",
    "open_producer",
]

log = logging.getLogger("rsc.client.producer")


class Producer(RoutingView):
    """Publishes to one logical stream through a coredis client (standalone or cluster).

    Run `run` in a nursery (`await nursery.start(producer.run)` returns once
    the layout is known; `publish` before that raises `RscError`); cancel it to
    stop heartbeating.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        redis: Any,
        stream_prefix: str,
        producer_id: str | None = None,
        *,
        pause_timeout_s: float = 30.0,
        delivery_timeout_s: float = 30.0,
        idempotent: bool = True,
    ) -> None:
        self.coordinator = coordinator
        self.redis = redis
        #: The lean writer of the append scripts (a standalone Redis), else None: coredis pipelines.
        self._writer = AppendWriter.for_client(redis)
        self.pause_timeout_s = pause_timeout_s
        #: How long a publish retries while Redis is unavailable before `PublishFailed`.
        self.delivery_timeout_s = delivery_timeout_s
        self.state = ProducerState(stream_prefix, producer_id or f"producer/{uuid.uuid4().hex[:12]}", CLIENT)
        #: Idempotence (feature level 6): each message appended once however often it is sent
        #: again, within a window of twice the delivery timeout (at least 2 minutes).
        self.state.idempotent = idempotent
        self.state.window_ms = int(max(MIN_WINDOW_S, 2 * delivery_timeout_s) * 1000)
        #: Outages of Redis (publishes retried) and of the coordinator (heartbeats failing):
        #: one line when each begins and one when it ends, not a line per retry.
        self.redis_outage = OutageLog(log, f"{self.producer_id}: Redis", clock=trio.current_time)
        #: Heartbeats, one at a time (the next one is built from the answer to the last).
        self._beating = trio.Lock()
        #: Layout refreshes, one at a time (those waiting use the layout the first one learnt).
        self._refreshing = trio.Lock()
        self.coordinator_outage = OutageLog(
            log,
            f"{self.producer_id}: producer heartbeats",
            down="fail",
            up="succeed again",
            clock=trio.current_time,
        )
        self._ready = trio.Event()
        self._resumed = trio.Event()
        self._resumed.set()
        self._idle = trio.Event()
        self._idle.set()
        self._closing = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then heartbeat until `aclose` (or cancelled); `started` once a layout is known.

        Raises `CoordinatorRejected` when the coordinator refuses the credential (401/403) before
        a layout is known; every other failed or refused heartbeat is logged and tried again."""
        if self._writer is not None:
            self._writer.keep()  # its connections are kept while the producer runs
        try:
            started = False
            while not self._closing.is_set():
                try:
                    await self.heartbeat()
                except CoordinatorRejected as exc:
                    if exc.code == "PRODUCER_FENCED":  # another process has our id: stop
                        return
                    if not started and exc.status in REFUSED_FOR_GOOD:
                        raise  # a wrong or insufficient credential: waiting will not help
                    log.warning("%s: producer heartbeat refused: %s", self.producer_id, exc)
                except CoordinatorUnavailable as exc:
                    self.coordinator_outage.failed(exc)
                else:
                    self.coordinator_outage.ok()
                if not started and self._ready.is_set():
                    task_status.started()
                    started = True
                with trio.move_on_after(self.state.interval_s if started else 0.5):
                    await self._closing.wait()
        finally:  # its connections do not outlive the run (a publish without one uses its own)
            if self._writer is not None:
                await self._writer.aclose()

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Stop heartbeating, wait for publishes in flight, then leave (the coordinator forgets us).

        Shielded and bounded by `timeout_s`, so it may run in a cancelled scope.
        """
        self._closing.set()
        with trio.CancelScope(deadline=trio.current_time() + timeout_s, shield=True):
            await self.flush()
            if self._writer is not None:
                await self._writer.aclose()
            if self._ready.is_set():
                try:
                    await self.coordinator.producer_heartbeat(self.state.request(leave=True))
                except (CoordinatorUnavailable, CoordinatorRejected) as exc:
                    log.warning("%s: could not leave (the lease will expire): %s", self.producer_id, exc)

    async def heartbeat(self) -> None:
        """One producer heartbeat: acknowledge the routed version, learn layout and pause state.

        Raises as `Coordinator.producer_heartbeat`: `CoordinatorUnavailable` (no answer after the
        retries), `CoordinatorUnintelligible` (an answer it cannot read), `CoordinatorRejected`."""
        async with self._beating:  # one at a time: a new process asks for its epoch once
            request = self.state.request()
            try:
                response = await self.coordinator.producer_heartbeat(request)
            except CoordinatorRejected as exc:
                if exc.code == "PRODUCER_FENCED":  # another process registered our id since
                    self.state.fence(exc.message)
                raise
            change = self.state.apply(response)
            self.state.sent(request)
        self._ready.set()
        if change.paused:
            self._resumed = trio.Event()
        elif change.resumed:
            self._resumed.set()

    async def publish(self, fields: Fields, key: Key = None) -> str:
        """Append one message to its shard; returns the entry id. Raises as `publish_many`."""
        return (await self.publish_many([(fields, key)]))[0]

    async def publish_many(self, messages: Sequence[tuple[Fields, Key]]) -> list[str]:
        """Append several messages, pipelined (one round trip per Redis node); ids in order.

        Each goes through `SEALED_APPEND`: a message refused because its shard is sealed (it
        drains: this producer's layout is stale) is routed again with the layout a heartbeat
        brings, and sent again; the others were written once. `NoWritableShards` when the
        stream has no ACTIVE shard.

        Raises `RscError` after `aclose`, and before `run` (or a `heartbeat`) has a layout;
        `ProducerPaused` when the stream stays paused past `pause_timeout_s`; `UnsupportedRouting`
        or `NoWritableShards` before sending anything; `PublishFailed` at once when Redis refuses a
        command, the credential or the script reload (NOSCRIPT), else once Redis stayed
        unavailable (the script reload included) or a sealed shard got no new layout for
        `delivery_timeout_s`."""
        await self._wait_until_open()
        with tracing.send_span(self.stream_prefix, len(messages)) as carried:
            if carried:  # each message carries the send span's context (rsc:traceparent)
                messages = [(tracing.with_context(fields, carried), key) for fields, key in messages]
            ids = await self._publish(messages)
            tracing.set_message_id(ids)
            return ids

    async def _publish(self, messages: Sequence[tuple[Fields, Key]]) -> list[str]:
        state = self.state
        state.in_flight += 1
        self._idle = trio.Event() if state.in_flight == 1 else self._idle
        publish = Publish(state, messages)
        try:
            retries = DeliveryRetries(trio.current_time(), self.delivery_timeout_s)
            while publish.pending:
                if state.fenced is not None:  # a heartbeat learnt it meanwhile
                    raise state.fenced_error()
                calls = publish.calls()  # those not answered as they were; the sealed ones routed again
                todo = [p for call in calls for p in call.positions]
                try:
                    results = await self._send(calls)
                    self.redis_outage.ok()
                    replies = self._written(publish, results)
                except RedisUnavailable as exc:  # unanswered: sent again as they are
                    await self._retry_later(retries, len(todo), exc, redis_down=True)
                    continue
                except RedisCommandFailed as exc:
                    raise publish_failed(self.stream_prefix, len(todo), exc) from exc
                if replies.unavailable:  # a node loading, read-only, busy: as when it does not answer
                    await self._retry_later(
                        retries, len(todo), RedisUnavailable(replies.unavailable), redis_down=True
                    )
                elif replies.sealed:
                    await self._refresh_layout(retries, len(todo))
                elif (held := held_back(self.stream_prefix, len(todo), replies)) is not None:
                    await self._report_full(replies.full_targets)
                    await self._retry_later(retries, len(todo), held, give_up=held)  # room comes: back off
            return publish.done()
        finally:
            publish.close()
            state.in_flight -= 1
            if not state.in_flight:
                self._idle.set()

    async def _send(self, calls: list[Append]) -> Sequence[object]:
        """One reply per call, in order (an error reply as its exception); the calls a Redis
        node answered `NOSCRIPT` (restarted, new, flushed) sent again once it is loaded
        (`rsc.scripts.reloading`). Raises as `redis_call`."""
        return await reloading(calls, self._send_once, self._load_script)

    async def _load_script(self, _: Sequence[Append]) -> None:
        with redis_call("SCRIPT LOAD"):
            await self.redis.script_load(SEALED_APPEND)

    async def _send_once(self, calls: Sequence[Append]) -> Sequence[object]:
        """One reply per call, in order (an error reply as its exception). Raises as `redis_call`
        (`RedisUnavailable`, `RedisCommandFailed`), through the lean writer
        (`rsc.client.append_writer`) or coredis."""
        with redis_call("XADD"):
            if self._writer is not None:
                return await self._writer.call(call.command for call in calls)
            async with self.redis.pipeline(transaction=False, raise_on_error=False) as pipe:
                for call in calls:
                    pipe.evalsha(SEALED_APPEND_SHA, keys=call.keys, args=call.args())
            return pipe.results or ()

    def _written(self, publish: Publish, results: Sequence[object]) -> Replies:
        """Note the ids written; what is to be sent again, and why.

        Raises `ProducerFenced` when a shard refused this producer's epoch, `PublishFailed` when
        Redis refused a call for another reason than a seal or an unknown script (some of its
        messages may have been written)."""
        replies = publish.take(results)
        if replies.fenced is not None:
            raise self.state.fence(replies.fenced)
        if replies.failure is not None:
            count = len(publish.ids)
            raise publish_failed(self.stream_prefix, count, RedisCommandFailed(replies.failure))
        return replies

    async def _refresh_layout(self, retries: DeliveryRetries, count: int) -> None:
        """A shard was sealed under us: learn the new layout now (a heartbeat), or wait a little."""
        before = self.state.layout.metadata_version
        async with self._refreshing:  # one heartbeat for every publish that met the seal
            if self.state.layout.metadata_version == before:
                try:
                    await self.heartbeat()
                except CoordinatorUnavailable as exc:
                    self.coordinator_outage.failed(f"refreshing the layout: {exc}")
                except CoordinatorRejected as exc:
                    log.warning("%s: could not refresh the layout: %s", self.producer_id, exc)
        if self.state.layout.metadata_version == before:
            await self._retry_later(retries, count, RscError("the shard is sealed and no new layout came"))

    async def _report_full(self, targets: list[str]) -> None:
        """Shards refused appends as full: tell the coordinator now (a heartbeat, at most one
        every `FULL_REPORT_GAP_S`), so that it trims them before its next retention round."""
        if not self.state.note_full(targets, trio.current_time()):
            return
        async with self._refreshing:
            try:
                await self.heartbeat()
            except (CoordinatorUnavailable, CoordinatorRejected) as exc:
                log.debug("%s: could not report full shards: %s", self.producer_id, exc)

    async def _retry_later(
        self,
        retries: DeliveryRetries,
        count: int,
        exc: Exception,
        redis_down: bool = False,
        give_up: PublishFailed | None = None,
    ) -> None:
        """Wait before the next try; raises `give_up` (else `PublishFailed`) past the timeout."""
        wait = retries.next_wait(trio.current_time())
        if wait is None:
            raise (give_up or publish_failed(self.stream_prefix, count, exc)) from exc
        if redis_down:  # one line per outage, not per publish
            self.redis_outage.failed(exc)
        elif retries.attempts == 1:
            log.warning("%s: publish not taken yet, retrying: %s", self.producer_id, exc)
        await trio.sleep(wait)

    async def flush(self) -> None:
        """Wait until nothing this producer started is in flight (publishes are not buffered)."""
        await self._idle.wait()

    async def _wait_until_open(self) -> None:
        """Raises `RscError` when the producer is closed or has no layout yet; waits while the
        stream is paused (not in flight: a paused producer reports quiesced), `ProducerPaused`
        after `pause_timeout_s`."""
        if self._closing.is_set():
            raise RscError(f"producer {self.producer_id!r} is closed")
        if self.state.fenced is not None:
            raise self.state.fenced_error()
        if not self._ready.is_set():
            raise RscError(
                f"producer {self.producer_id!r} is not started: await nursery.start(producer.run) "
                "(it returns once the layout is known), or use open_producer"
            )
        if self._resumed.is_set():
            return
        with trio.move_on_after(self.pause_timeout_s):
            await self._resumed.wait()
            return
        raise ProducerPaused(f"stream {self.stream_prefix!r} stayed paused for {self.pause_timeout_s} s")


@contextlib.asynccontextmanager
async def open_producer(
    coordinator: Coordinator,
    redis: Any,
    stream_prefix: str,
    producer_id: str | None = None,
    *,
    pause_timeout_s: float = 30.0,
    start_timeout_s: float = 10.0,
    delivery_timeout_s: float = 30.0,
    idempotent: bool = True,
) -> AsyncIterator[Producer]:
    """A registered `Producer` (its layout known), heartbeating until the block ends, then closed.

    Raises `CoordinatorUnavailable` if no layout arrives within `start_timeout_s`, and
    `CoordinatorRejected` at once if the coordinator refuses the credential (401/403).
    An exception of the block comes out as itself, not wrapped in an exception group.
    Other refusals (404 `UNKNOWN_STREAM`...) are only logged: they end as that
    `CoordinatorUnavailable`. Several exceptions at once come out as their exception group.
    """
    producer = Producer(
        coordinator,
        redis,
        stream_prefix,
        producer_id,
        pause_timeout_s=pause_timeout_s,
        delivery_timeout_s=delivery_timeout_s,
        idempotent=idempotent,
    )
    try:
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(start_timeout_s):
                await nursery.start(producer.run)
            if not producer.state.known:
                raise CoordinatorUnavailable(
                    f"producer {producer.producer_id!r} got no layout within {start_timeout_s} s"
                )
            try:
                yield producer
            finally:
                await producer.aclose()
    except BaseExceptionGroup as group:
        raise _single(group) from None


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside nested one-member groups, or the group itself."""
    while len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return group


@contextlib.asynccontextmanager
async def connect_producer(
    stream_prefix: str,
    producer_id: str | None = None,
    *,
    coordinator_url: str | Sequence[str] | None = None,
    redis_url: str | None = None,
    token: str | None = None,
    **settings: Any,
) -> AsyncIterator[Producer]:
    """A registered `Producer` from URLs, in one call (`open_producer` takes objects):

        async with connect_producer("orders") as producer:
            await producer.publish({"id": "1"}, "customer-7")

    `coordinator_url` (one, several, or comma-separated) defaults to `RSC_COORDINATOR_URL`, then
    `http://127.0.0.1:8080`; `redis_url` (the forms of `rsc.connect.open_redis`) to
    `RSC_REDIS_URL`, then `redis://127.0.0.1:6379`; `token` to `RSC_TOKEN`. `settings` go to
    `open_producer` (`delivery_timeout_s`, `idempotent`, ...). Raises as `open_producer`, and
    as `open_redis` for a Redis URL it cannot use."""
    url = coordinator_url or os.environ.get("RSC_COORDINATOR_URL") or "http://127.0.0.1:8080"
    async with (
        Coordinator(url, token=token) as coordinator,
        open_redis(redis_url or os.environ.get("RSC_REDIS_URL") or DEFAULT_REDIS_URL) as redis,
        open_producer(coordinator, redis, stream_prefix, producer_id, **settings) as producer,
    ):
        yield producer

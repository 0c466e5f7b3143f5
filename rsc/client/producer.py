"""The trio producer: routes by partition key with the coordinator's layout (`jump-v1`).

* It registers through `POST /v1/producers/heartbeat` and heartbeats at the
  interval it is given, acknowledging the layout version it routes with; a
  new version in an answer switches its routing at once (online scale-out).
* `publish(fields, key=...)` appends to the key's shard; without a key,
  messages go round robin over the ACTIVE shards. `publish_many` pipelines.
* While the stream is paused, `publish` waits up to `pause_timeout_s` for a
  resume, then raises `ProducerPaused`; meanwhile the producer reports
  `quiesced` once nothing of its own is in flight.
* At-least-once: a publish that failed may be retried by the caller; across
  a scale-out, messages of one key may be split between two shards (see
  docs/routing.md).
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from rsc.client.coordinator import Coordinator
from rsc.client.errors import CoordinatorRejected, CoordinatorUnavailable, RscError
from rsc.client.member import CLIENT
from rsc.events.model import EMPTY_LAYOUT, PROTOCOL_VERSION, Layout
from rsc.events.routing import route
from rsc.events.wire import ProducerHeartbeatRequest

log = logging.getLogger("rsc.client.producer")

Fields = Mapping[str, str | bytes | int | float]


class ProducerPaused(RscError):
    """The stream stayed paused longer than the producer's `pause_timeout_s`."""


class Producer:
    def __init__(
        self,
        coordinator: Coordinator,
        redis: Any,
        stream_prefix: str,
        producer_id: str | None = None,
        *,
        pause_timeout_s: float = 30.0,
    ) -> None:
        self.coordinator = coordinator
        self.redis = redis
        self.stream_prefix = stream_prefix
        self.producer_id = producer_id or f"producer/{uuid.uuid4().hex[:12]}"
        self.pause_timeout_s = pause_timeout_s
        self.layout: Layout = EMPTY_LAYOUT
        self.paused = False
        self.interval_s = 3.0
        self.published = 0
        self._in_flight = 0
        self._ready = trio.Event()
        self._resumed = trio.Event()
        self._resumed.set()
        self._round_robin = itertools.count()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then heartbeat until cancelled; `started` once a layout is known."""
        started = False
        while True:
            try:
                await self.heartbeat()
            except (CoordinatorUnavailable, CoordinatorRejected) as exc:
                log.warning("%s: producer heartbeat failed: %s", self.producer_id, exc)
            if not started and self._ready.is_set():
                task_status.started()
                started = True
            await trio.sleep(self.interval_s if started else 0.5)

    async def heartbeat(self) -> None:
        """One producer heartbeat: acknowledge the routed version, learn layout and pause state."""
        request = ProducerHeartbeatRequest(
            protocol_version=PROTOCOL_VERSION,
            stream_prefix=self.stream_prefix,
            producer_id=self.producer_id,
            metadata_version=self.layout.metadata_version,
            quiesced=self.paused and self._in_flight == 0,
            client=CLIENT,
        )
        response = await self.coordinator.producer_heartbeat(request)
        self.interval_s = response.heartbeat_interval_ms / 1000
        if response.layout is not None and response.layout.metadata_version != self.layout.metadata_version:
            log.info("%s: routing with layout v%s", self.producer_id, response.layout.metadata_version)
            self.layout = response.layout
        self._ready.set()
        if response.paused and not self.paused:
            self.paused = True
            self._resumed = trio.Event()
        elif not response.paused and self.paused:
            self.paused = False
            self._resumed.set()

    def shard_key(self, key: bytes | str | None) -> str:
        """The Redis key a message with `key` goes to under the current layout."""
        if key is None:
            active = self.layout.active
            if not active:
                raise RscError(f"stream {self.stream_prefix!r} has no ACTIVE shard")
            return active[next(self._round_robin) % len(active)].key
        return route(self.layout, key.encode() if isinstance(key, str) else key).key

    async def publish(self, fields: Fields, key: bytes | str | None = None) -> str:
        """Append one message to its shard; returns the entry id."""
        return (await self.publish_many([(fields, key)]))[0]

    async def publish_many(self, messages: Sequence[tuple[Fields, bytes | str | None]]) -> list[str]:
        """Append several messages, pipelined (one round trip per Redis node); ids in order."""
        await self._wait_until_open()
        self._in_flight += 1
        try:
            targets = [self.shard_key(key) for _, key in messages]
            async with self.redis.pipeline(transaction=False) as pipe:
                pending = [
                    pipe.xadd(target, dict(fields))
                    for (fields, _), target in zip(messages, targets, strict=True)
                ]
            ids = [str(await entry) for entry in pending]
            self.published += len(ids)
            return ids
        finally:
            self._in_flight -= 1

    async def flush(self) -> None:
        """Wait until nothing this producer started is in flight (publishes are not buffered)."""
        while self._in_flight:
            await trio.sleep(0.001)

    async def _wait_until_open(self) -> None:
        await self._ready.wait()
        if self._resumed.is_set():
            return
        with trio.move_on_after(self.pause_timeout_s):
            await self._resumed.wait()
            return
        raise ProducerPaused(f"stream {self.stream_prefix!r} stayed paused for {self.pause_timeout_s} s")

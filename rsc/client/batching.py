"""Heartbeats of one process's members in one request (`POST /v1/heartbeats`).

`BatchingTransport` is a member transport: each member's `heartbeat` call
waits at most `linger_s` for the other members of the process to heartbeat
too, then one request carries them all and each member gets its own answer
(or its own error). Members started together heartbeat at the same interval,
so after the first round they travel together. A heartbeat acknowledging a revoke
(`revoked_shards`) does not wait: another member waits for those shards, so it goes at
once, with whatever is waiting to go. A long-poll heartbeat (`wait_ms`, sent while a member
waits for pending shards) goes on its own request, at most `max_long_polls` at once.
"""

from __future__ import annotations

import attrs
import trio

from rsc.client.coordinator import Coordinator
from rsc.client.errors import CoordinatorRejected, CoordinatorUnavailable
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse


class _Slot:
    def __init__(self, request: HeartbeatRequest) -> None:
        self.request = request
        self.done = trio.Event()
        self.response: HeartbeatResponse | None = None
        self.error: Exception | None = None


class BatchingTransport:
    """A member transport that batches heartbeats (see the module doc); `run` it first."""

    def __init__(
        self,
        coordinator: Coordinator,
        linger_s: float = 0.005,
        max_batch: int = 500,
        max_long_polls: int = 32,
    ) -> None:
        self.coordinator = coordinator
        self.max_long_polls = max_long_polls
        self.long_polls = 0
        self.linger_s = linger_s
        self.max_batch = max_batch
        self.requests_sent = 0
        self._pending: list[_Slot] = []
        self._flush_scheduled = False
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve batches until cancelled (start it in the nursery the members run in).

        A batch the coordinator failed or refused is each waiting member's error (`heartbeat`);
        only what `Coordinator.heartbeats` raises beyond its own errors (none expected) ends it."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        """This member's answer: batched with the others while `run` runs, else sent alone.

        Raises as `Coordinator.heartbeats` does, for the whole batch (`CoordinatorUnavailable`,
        `CoordinatorUnintelligible`, `CoordinatorRejected`: the same exception object in every
        member of it), or `CoordinatorRejected` (status 400) for this member's refused item; a
        heartbeat sent alone (before `run`, or a long poll) raises as `Coordinator.heartbeat`."""
        if self._nursery is None:
            return await self.coordinator.heartbeat(request)
        if request.wait_ms:
            # A long poll goes on its own (held in a batch it would hold every other answer),
            # up to `max_long_polls` at once (each holds a connection); the others travel
            # batched without asking to wait, and their members heartbeat at the interval.
            if self.long_polls < self.max_long_polls:
                self.long_polls += 1
                try:
                    return await self.coordinator.heartbeat(request)
                finally:
                    self.long_polls -= 1
            request = attrs.evolve(request, wait_ms=0)
        slot = _Slot(request)
        self._pending.append(slot)
        if len(self._pending) >= self.max_batch or request.revoked_shards:
            # A handoff waits on an acknowledgement: it does not linger for company.
            self._nursery.start_soon(self._flush)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._nursery.start_soon(self._flush_later)
        await slot.done.wait()
        if slot.error is not None:
            raise slot.error
        assert slot.response is not None
        return slot.response

    async def _flush_later(self) -> None:
        await trio.sleep(self.linger_s)
        self._flush_scheduled = False
        await self._flush()

    async def _flush(self) -> None:
        slots, self._pending = self._pending, []
        if not slots:
            return
        self.requests_sent += 1
        try:
            answers = await self.coordinator.heartbeats([s.request for s in slots])
        except (CoordinatorUnavailable, CoordinatorRejected) as exc:
            for slot in slots:
                slot.error = exc
                slot.done.set()
            return
        for slot, answer in zip(slots, answers, strict=True):
            if isinstance(answer, CoordinatorRejected):
                slot.error = answer
            else:
                slot.response = answer
            slot.done.set()

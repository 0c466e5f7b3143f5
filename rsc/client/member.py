"""The member runtime: one logical member of a consumer group, driven by its heartbeats.

What it keeps (PROTOCOL sections 3-4):

* It heartbeats at the interval the coordinator gives, and at once after it
  has something to acknowledge or must rejoin.
* Reconciliation: shards in `revoke`, and shards it reads that are no longer
  in `assigned`, are stopped through `ShardLifecycle.revoke` and then
  acknowledged; a shard is started only once it is in `assigned`.
* SYNC_METADATA: it adopts the stored layout and reports that version.
* FENCED or UNKNOWN_MEMBER: every shard is dropped at once (`lost`), and it
  rejoins with epoch 0.
* Self-fencing: when no heartbeat has succeeded within the lease, counted
  from when the last successful request was *sent*, minus a safety margin,
  it drops every shard (`lost`) even while a request is still in flight.
* Graceful leave on `stop()`: revoke everything while heartbeats go on, then heartbeat
  with epoch -1.

Time is trio's clock, so tests run it under the autojump clock. The transport
is anything with `heartbeat(request) -> response` (`Coordinator` over HTTP).
"""

from __future__ import annotations

import logging
import uuid
from typing import Protocol

import attrs
import trio

from rsc import __version__
from rsc.client.errors import CoordinatorRejected, CoordinatorUnavailable, CoordinatorUnintelligible
from rsc.client.lifecycle import NoLifecycle, ShardLifecycle
from rsc.events.model import EMPTY_LAYOUT, PROTOCOL_VERSION, ClientInfo, HeartbeatStatus, Layout
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse

#: Refusals that end when an operator creates the stream or group (Admin API): retried.
WAIT_FOR_ADMIN = frozenset({"UNKNOWN_STREAM", "UNKNOWN_GROUP"})

log = logging.getLogger("rsc.client.member")
#: How members of this library introduce themselves to the coordinator.
CLIENT = ClientInfo("rsc-python", __version__)


class HeartbeatTransport(Protocol):
    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse: ...


@attrs.frozen
class MemberSettings:
    #: Self-fence this long before the lease would end (a fraction of the lease).
    safety_margin: float = 0.2
    #: After a failed heartbeat, try again this soon (never later than the interval).
    retry_interval_s: float = 0.5
    #: Until the coordinator says otherwise.
    heartbeat_interval_ms: int = 3_000
    lease_ttl_ms: int = 10_000


class Member:
    """One member id of a group; `run` it in a nursery, `stop` it to leave gracefully."""

    def __init__(
        self,
        transport: HeartbeatTransport,
        stream_prefix: str,
        group: str,
        member_id: str,
        lifecycle: ShardLifecycle | None = None,
        *,
        client: ClientInfo = CLIENT,
        incarnation: str | None = None,
        settings: MemberSettings = MemberSettings(),
    ) -> None:
        self.transport = transport
        self.stream_prefix = stream_prefix
        self.group = group
        self.member_id = member_id
        self.lifecycle: ShardLifecycle = lifecycle or NoLifecycle()
        self.client = client
        self.incarnation = incarnation or uuid.uuid4().hex
        self.settings = settings
        self.epoch = 0
        #: Shards this member holds: reading, or being revoked (`revoking`) until acknowledged.
        self.owned: frozenset[int] = frozenset()
        self.revoking: frozenset[int] = frozenset()
        self.to_ack: frozenset[int] = frozenset()
        self.layout: Layout = EMPTY_LAYOUT
        self.metadata_version = 0
        self.interval_s = settings.heartbeat_interval_ms / 1000
        self.lease_s = settings.lease_ttl_ms / 1000
        self.max_concurrency: int | None = None
        self.status: HeartbeatStatus | None = None
        self.last_ok_sent: float | None = None
        #: Since when heartbeats have failed (None: the last one succeeded).
        self.failing_since: float | None = None
        #: Since when every answer has been one this client cannot read (None: the last was fine).
        self.unintelligible_since: float | None = None
        self.self_fenced = 0
        #: Why it left for good (answers it cannot read): raised by `run`.
        self.gave_up: CoordinatorUnintelligible | None = None
        self._stopping = trio.Event()
        self._left = trio.Event()
        self._wakeup = trio.Event()
        self._revokes: trio.Nursery | None = None
        self._revoke_scopes: set[trio.CancelScope] = set()
        self._beat_scope: trio.CancelScope | None = None

    # --- driving ----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat until `stop()`, then leave. Returns once the member has left.

        Raises `CoordinatorUnintelligible` after leaving the group when, for a whole lease,
        no answer of the coordinator could be read (a coordinator newer than this client).
        """
        task_status.started()
        try:
            async with trio.open_nursery() as revokes:
                self._revokes = revokes
                while True:
                    if self._stopping.is_set():
                        # Leaving: revoke everything while heartbeats go on (the lease holds
                        # while in-flight work finishes), then send epoch -1.
                        if self.owned - self.revoking:
                            await self._revoke(self.owned - self.revoking)
                        if not self.owned:
                            break
                    urgent = await self.beat()
                    if urgent:
                        continue
                    with trio.move_on_after(self._wait_s()):
                        await self._wakeup.wait()
                    self._wakeup = trio.Event()
                await self.leave()
        finally:
            self._revokes = None
            self._left.set()
        if self.gave_up is not None:
            raise self.gave_up

    def stop(self) -> None:
        """Ask the member to leave: it revokes everything while it goes on heartbeating, then
        heartbeats with epoch -1."""
        self._stopping.set()
        self._wakeup.set()
        if self._beat_scope is not None:  # leaving: do not wait a whole lease for an answer
            limit = trio.current_time() + self._leave_wait_s()
            self._beat_scope.deadline = min(self._beat_scope.deadline, limit)

    async def wait_left(self) -> None:
        await self._left.wait()

    def request(self) -> HeartbeatRequest:
        """The heartbeat this member would send now."""
        return HeartbeatRequest(
            protocol_version=PROTOCOL_VERSION,
            stream_prefix=self.stream_prefix,
            consumer_group=self.group,
            member_id=self.member_id,
            incarnation=self.incarnation,
            member_epoch=self.epoch,
            metadata_version=self.metadata_version,
            owned_shards=self.owned,
            revoked_shards=self.to_ack,
            drain_progress=tuple(self.lifecycle.drain_progress()),
            client=self.client,
        )

    async def beat(self) -> bool:
        """One heartbeat exchange; True when the next one should go at once.

        A transport failure, a 5xx, a timeout and an answer this client cannot read are all
        a failed heartbeat: retried (sooner than the interval) until the lease rule says to
        stop every shard (`_fence_at`).
        """
        request = self.request()
        sent = trio.current_time()
        response = None
        # A heartbeat slower than a lease is worthless: give up on it then, or at the fence.
        deadline = min(self._fence_at(), sent + self.lease_s)
        if self._stopping.is_set():
            deadline = min(deadline, sent + self._leave_wait_s())
        with trio.move_on_at(deadline) as timeout:
            self._beat_scope = timeout
            try:
                response = await self.transport.heartbeat(request)
            except CoordinatorUnintelligible as exc:
                self._unintelligible(sent, exc)
            except CoordinatorUnavailable as exc:
                self._failed(sent, exc)
            except CoordinatorRejected as exc:
                if exc.status >= 500 or exc.status in (408, 429):
                    self._failed(sent, exc)
                elif exc.code in WAIT_FOR_ADMIN:
                    # Its credential may not create the stream or group: an operator will.
                    log.warning("%s: %s; retrying until it exists", self.member_id, exc.message)
                elif exc.code == "INCARNATION_MISMATCH":
                    # Another process drives this member id: wait for its lease to end.
                    log.warning("%s: %s", self.member_id, exc.message)
                else:
                    raise
        self._beat_scope = None
        if self._stopping.is_set() and not self.owned:
            return False  # everything revoked while it waited: leave now, not after the answer
        if timeout.cancelled_caught:
            self._failed(sent, CoordinatorUnavailable("no answer in time"))
        if response is None:
            if trio.current_time() >= self._fence_at():
                await self._self_fence()
            await self._give_up_if_unintelligible()
            return False
        if self.failing_since is not None:
            log.warning(
                "%s: heartbeats succeed again (after %.1f s)",
                self.member_id,
                trio.current_time() - self.failing_since,
            )
            self.failing_since = None
        self.unintelligible_since = None
        self.last_ok_sent = sent
        return await self.apply(request, response, sent)

    async def apply(
        self, request: HeartbeatRequest, response: HeartbeatResponse, sent: float | None = None
    ) -> bool:
        """Reconcile with one response to `request` (sent at trio time `sent`, default now);
        True when the next heartbeat should go at once."""
        self.status = response.status
        self.interval_s = response.heartbeat_interval_ms / 1000
        self.lease_s = response.lease_ttl_ms / 1000
        if response.layout is not None:
            self.layout = response.layout
        self.metadata_version = response.metadata_version
        if response.status in (HeartbeatStatus.FENCED, HeartbeatStatus.UNKNOWN_MEMBER):
            if self.owned:
                log.warning(
                    "%s: %s by the coordinator (%s); dropping every shard and rejoining",
                    self.member_id,
                    response.status.value,
                    response.fence_reason.value if response.fence_reason else "not a member",
                )
            await self._drop_all()
            self.epoch = 0
            return True  # rejoin now
        if request.member_epoch == -1:
            return False
        self.epoch = response.member_epoch
        # What this member holds is its own until the lease, counted from when it asked.
        sent = trio.current_time() if sent is None else sent
        self.lifecycle.renewed(sent + self.lease_s * (1 - self.settings.safety_margin))
        self.to_ack -= request.revoked_shards  # the coordinator has them
        if response.max_concurrency != self.max_concurrency:
            self.max_concurrency = response.max_concurrency
            await self.lifecycle.concurrency(response.max_concurrency)
        assignment = response.assignment
        stop = (self.owned - self.revoking) & (assignment.revoke | (self.owned - assignment.assigned))
        if stop:
            await self._revoke(stop)
        # Revoked shards never started are acknowledged too: they are not read.
        self.to_ack |= assignment.revoke - self.owned
        start = assignment.assigned - self.owned
        if start and not self._stopping.is_set():
            await self.lifecycle.assigned(start, self.layout)
            self.owned |= start
        return bool(self.to_ack)

    async def _revoke(self, shards: frozenset[int]) -> None:
        """Stop `shards` (in-flight work finishes) while heartbeats go on, then acknowledge them.

        The member keeps reporting them as owned until then, so the coordinator installs them
        nowhere else meanwhile (PROTOCOL section 4).
        """
        self.revoking |= shards

        async def revoke() -> None:
            with trio.CancelScope() as scope:
                self._revoke_scopes.add(scope)
                try:
                    await self.lifecycle.revoke(shards)
                finally:
                    self._revoke_scopes.discard(scope)
            if scope.cancelled_caught:  # lost meanwhile (`_drop_all`)
                return
            self.revoking -= shards
            self.owned -= shards
            self.to_ack |= shards
            self._wakeup.set()  # acknowledge now

        if self._revokes is None:  # driven by hand (`beat` outside `run`): wait for it
            await revoke()
        else:
            self._revokes.start_soon(revoke)

    async def leave(self) -> None:
        """Stop every shard, acknowledge, and leave the group (epoch -1)."""
        with trio.move_on_after(self.lease_s):
            while self.revoking:  # revokes under way finish first
                await self._wakeup.wait()
                self._wakeup = trio.Event()
        if self.owned:
            await self.lifecycle.revoke(self.owned)
            self.to_ack |= self.owned
            self.owned = self.revoking = frozenset()
        self.epoch = -1
        request = self.request()
        with trio.move_on_after(self._leave_wait_s()):
            try:
                await self.transport.heartbeat(request)
            except (CoordinatorUnavailable, CoordinatorRejected) as exc:
                log.info("%s: leave not acknowledged (the lease will end it): %s", self.member_id, exc)
        self.to_ack = frozenset()
        self.epoch = 0

    # --- time -----------------------------------------------------------

    def _leave_wait_s(self) -> float:
        """How long a leaving member waits for an answer."""
        return max(self.interval_s, 1.0)

    def _fence_at(self) -> float:
        """When this member must have stopped everything without a successful heartbeat."""
        if self.last_ok_sent is None or not self.owned:
            return float("inf")
        return self.last_ok_sent + self.lease_s * (1 - self.settings.safety_margin)

    def _wait_s(self) -> float:
        if self.last_ok_sent is None or self.status is None:
            return min(self.settings.retry_interval_s, self.interval_s)
        wait = self.interval_s if self._healthy() else min(self.settings.retry_interval_s, self.interval_s)
        return max(0.0, min(wait, self._fence_at() - trio.current_time()))

    def _healthy(self) -> bool:
        return (
            self.last_ok_sent is not None and trio.current_time() - self.last_ok_sent < self.interval_s * 1.5
        )

    async def _self_fence(self) -> None:
        log.warning("%s: no heartbeat succeeded within the lease; dropping every shard", self.member_id)
        self.self_fenced += 1
        await self._drop_all()

    def _failed(self, sent: float, exc: Exception) -> None:
        """A failed heartbeat: one line when a run of failures starts, not one per retry."""
        if self.failing_since is None:
            self.failing_since = sent
            log.warning("%s: heartbeat failed, retrying within the lease: %s", self.member_id, exc)
        else:
            log.debug("%s: heartbeat failed: %s", self.member_id, exc)

    def _unintelligible(self, sent: float, exc: CoordinatorUnintelligible) -> None:
        self.failing_since = self.failing_since or sent
        if self.unintelligible_since is None:
            self.unintelligible_since = sent
            log.warning("%s: cannot read the coordinator's answer: %s", self.member_id, exc)

    async def _give_up_if_unintelligible(self) -> None:
        """After a lease of answers it cannot read, leave: the coordinator, which reads this
        member's heartbeats, would otherwise keep installing shards that nobody reads."""
        since = self.unintelligible_since
        if since is None or trio.current_time() - since < self.lease_s:
            return
        message = (
            f"{self.member_id}: no answer of the coordinator could be read for {self.lease_s:g} s "
            f"(a coordinator newer than this client {self.client.name} {self.client.version}?); "
            "leaving the group so that its shards move"
        )
        log.error("%s", message)
        await self._drop_all()
        self.gave_up = CoordinatorUnintelligible(message)
        self.stop()  # `run` leaves (the coordinator reads that, even if its answer is unreadable)

    async def _drop_all(self) -> None:
        lost = self.owned
        self.owned = self.revoking = frozenset()
        self.to_ack = frozenset()
        for scope in self._revoke_scopes:  # revokes under way end here: the shards are lost
            scope.cancel()
        if lost:
            await self.lifecycle.lost(lost)
        self.lifecycle.renewed(float("-inf"))

"""The member runtime: the trio shell that drives one `MemberMachine`.

Every protocol decision (what to report, what to stop, start or drop, the
lease rule, when the next heartbeat is due, the graceful leave) is the pure
machine's, in `rsc.events.member_machine`; this module only sends its heartbeats,
performs its `Steps` on a `ShardLifecycle`, runs revokes concurrently with
heartbeats, and logs. Time is trio's clock, so tests run it under the
autojump clock. The transport is anything with `heartbeat(request) ->
response` (`Coordinator` over HTTP, or `BatchingTransport`).
"""

from __future__ import annotations

import logging
import uuid
from typing import Protocol

import trio

from rsc import __version__
from rsc.client.errors import (
    CoordinatorRejected,
    CoordinatorUnavailable,
    CoordinatorUnintelligible,
    MemberReplaced,
)
from rsc.client.lifecycle import NoLifecycle, ShardLifecycle
from rsc.events.member_machine import DEFAULT_SETTINGS, MemberMachine, MemberSettings, Steps
from rsc.events.model import ClientInfo, HeartbeatStatus, Layout, ShardState
from rsc.events.versions import MAX_FEATURE_LEVEL
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from rsc.outage import OutageLog
from rsc.redis_errors import first_leaf

__all__ = ["CLIENT", "HeartbeatTransport", "Member", "MemberSettings"]

#: Refusals that end when an operator creates the stream or group (Admin API): retried.
WAIT_FOR_ADMIN = frozenset({"UNKNOWN_STREAM", "UNKNOWN_GROUP"})
#: Refusals that end by themselves: retried as failed heartbeats.
RETRIED = WAIT_FOR_ADMIN | {"INCARNATION_MISMATCH", "DELETED"}

log = logging.getLogger("rsc.client.member")


def coordinator_outage() -> OutageLog:
    """Outages of the coordinator as the members sharing it see them."""
    return OutageLog(log, "heartbeats", down="fail", up="succeed again", clock=trio.current_time)


#: How members of this library introduce themselves to the coordinator.
CLIENT = ClientInfo("rsc-python", __version__, MAX_FEATURE_LEVEL)


class HeartbeatTransport(Protocol):
    """What sends a member's heartbeat. `heartbeat` raises as `Coordinator.heartbeat` does:
    `Member.beat` counts `CoordinatorUnavailable` and some refusals as failed heartbeats."""

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse: ...


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
        settings: MemberSettings = DEFAULT_SETTINGS,
        outage: OutageLog | None = None,
    ) -> None:
        self.transport = transport
        #: Heartbeats without an answer, logged as outages (an `App` shares one among its
        #: members: one line when the coordinator stops answering, one when it answers again).
        self.outage = outage or coordinator_outage()
        self.lifecycle: ShardLifecycle = lifecycle or NoLifecycle()
        self.machine = MemberMachine(
            stream_prefix, group, member_id, incarnation or uuid.uuid4().hex, client, settings
        )
        self._left = trio.Event()
        self._wakeup = trio.Event()
        self._revokes: trio.Nursery | None = None
        self._revoke_scopes: dict[trio.CancelScope, frozenset[int]] = {}
        self._beat_scope: trio.CancelScope | None = None
        #: The pending shards last said in the log (said again only when they change).
        self._said_pending: frozenset[int] = frozenset()

    # --- what it believes (the machine's) ------------------------------------

    @property
    def member_id(self) -> str:
        return self.machine.member_id

    @property
    def incarnation(self) -> str:
        return self.machine.incarnation

    @property
    def owned(self) -> frozenset[int]:
        return self.machine.owned

    @property
    def epoch(self) -> int:
        return self.machine.epoch

    @property
    def layout(self) -> Layout:
        return self.machine.layout

    @property
    def status(self) -> HeartbeatStatus | None:
        return self.machine.status

    @property
    def self_fenced(self) -> int:
        return self.machine.self_fenced

    # --- driving ----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat until `stop()`, then leave. Returns once the member has left.

        Raises `CoordinatorUnintelligible` after leaving the group when, for a whole lease,
        no answer of the coordinator could be read (a coordinator newer than this client);
        `MemberReplaced` when a newer process took its static member id over.
        `CoordinatorRejected` (a heartbeat refused for good, see `beat`) and whatever a lifecycle
        method raises end it at once, without leaving (the lease ends the membership); of
        several such errors at once (concurrent revokes), only the first is raised.
        """
        machine = self.machine
        task_status.started()
        try:
            async with trio.open_nursery() as revokes:
                self._revokes = revokes
                try:
                    while not machine.left:
                        await self._perform(machine.silent(trio.current_time()))
                        now = trio.current_time()
                        if machine.next_heartbeat_at(now) <= now:
                            await self.beat()
                            continue
                        with trio.move_on_at(machine.next_heartbeat_at(now)):
                            await self._wakeup.wait()
                        self._wakeup = trio.Event()
                finally:
                    self._revokes = None  # no revoke starts once the loop is over (left, cancelled)
                revokes.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the nursery's: raise what went wrong, as itself
            raise first_leaf(group) from None
        finally:
            self._revokes = None
            self._left.set()
        if machine.replaced is not None:
            raise MemberReplaced(f"{self.member_id}: {machine.replaced}")
        if machine.gave_up is not None:
            raise CoordinatorUnintelligible(f"{self.member_id}: {machine.gave_up}")

    def stop(self) -> None:
        """Ask the member to leave: it revokes everything while it goes on heartbeating, then
        heartbeats with epoch -1."""
        if self.machine.leaving:
            return
        self._start_revokes(self.machine.stop().stop)
        self._wakeup.set()
        if self._beat_scope is not None:  # leaving: do not wait a whole lease for an answer
            limit = trio.current_time() + self.machine.leave_wait_s
            self._beat_scope.deadline = min(self._beat_scope.deadline, limit)

    async def wait_left(self) -> None:
        await self._left.wait()

    def _stalled(self) -> frozenset[int]:
        """Shards the lifecycle cannot read for want of a key, group or owner token (a lifecycle
        without `stalled_shards`, as one written before it existed, reports none)."""
        stalled = getattr(self.lifecycle, "stalled_shards", None)
        return frozenset(stalled()) if stalled is not None else frozenset()

    def request(self) -> HeartbeatRequest:
        """The heartbeat this member would send now (nothing is sent or marked sent).

        Raises what the lifecycle's `drain_progress` or `stalled_shards` raises."""
        return self.machine.preview(tuple(self.lifecycle.drain_progress()), self._stalled())

    async def beat(self) -> None:
        """One heartbeat exchange, its steps performed.

        A transport failure, a 5xx, a timeout and an answer this client cannot read are all
        a failed heartbeat: retried (sooner than the interval) until the lease rule says to
        stop every shard. So are a refused leave and the refusals that end by themselves (5xx,
        408, 429, `UNKNOWN_STREAM`, `UNKNOWN_GROUP`, `INCARNATION_MISMATCH`, `DELETED`); any other
        refusal (401, 403, 400 `INVALID_REQUEST`...) raises `CoordinatorRejected`. Whatever a
        lifecycle method called here raises leaves as itself.
        """
        machine = self.machine
        request = machine.request(
            trio.current_time(), tuple(self.lifecycle.drain_progress()), self._stalled()
        )
        response = None
        why = "no answer in time"
        unintelligible = False
        with trio.move_on_at(machine.answer_deadline(trio.current_time())) as scope:
            self._beat_scope = scope
            try:
                response = await self.transport.heartbeat(request)
            except CoordinatorUnintelligible as exc:
                why, unintelligible = str(exc), True
            except CoordinatorUnavailable as exc:
                why = str(exc)
            except CoordinatorRejected as exc:
                leaving = request.member_epoch == -1  # a refused leave: the lease will end it
                if not (leaving or exc.status >= 500 or exc.status in (408, 429) or exc.code in RETRIED):
                    raise
                why = exc.message if exc.code in RETRIED else str(exc)
                if exc.code in WAIT_FOR_ADMIN:  # its credential may not create them: an operator will
                    why += "; retrying until it exists"
        self._beat_scope = None
        now = trio.current_time()
        if response is None:
            steps = machine.failed(request, now, why, unintelligible=unintelligible)
        else:
            steps = machine.receive(request, response, now)
        await self._perform(steps)

    # --- steps ------------------------------------------------------------

    async def _perform(self, steps: Steps) -> None:
        if steps.unanswered is not None:
            self.outage.failed(f"{self.member_id}: {steps.unanswered}")
        elif steps.answered:
            self.outage.ok()
        for line in steps.warnings:
            if line != steps.replaced:  # said once, as an error, below
                log.warning("%s: %s", self.member_id, line)
        if steps.gave_up is not None:
            log.error("%s: %s", self.member_id, steps.gave_up)
        if steps.replaced is not None:
            log.error("%s: %s", self.member_id, steps.replaced)
        if steps.lost:
            log.info("%s: lost shards %s", self.member_id, sorted(steps.lost))
            for scope, shards in list(self._revoke_scopes.items()):
                if shards & steps.lost:  # revokes under way end here: the shards are lost
                    scope.cancel()
            await self.lifecycle.lost(steps.lost)
        if steps.renew_until is not None:
            self.lifecycle.renewed(steps.renew_until)
        if steps.concurrency is not None:
            await self.lifecycle.concurrency(steps.concurrency)
        if steps.stop:
            # A shard that retired (drained by a scale-in) is not handed to anyone: say which.
            retired = {s.index for s in self.machine.layout.shards if s.state is ShardState.RETIRED}
            handed = sorted(steps.stop - retired)
            if handed:
                log.info("%s: revoking shards %s", self.member_id, handed)
            if steps.stop & retired:
                log.info("%s: stops reading retired shards %s", self.member_id, sorted(steps.stop & retired))
        if self._revokes is None:  # driven by hand (`beat` outside `run`): revoke in line
            await self._revoke(steps.stop)
        else:
            self._start_revokes(steps.stop)
        if steps.start:
            log.info("%s: reads shards %s (epoch %d)", self.member_id, sorted(steps.start), self.epoch)
            await self.lifecycle.assigned(steps.start, steps.layout)
        pending = self.machine.pending
        if pending != self._said_pending:
            if pending - self._said_pending:
                log.info(
                    "%s: waits for shards %s (their last holder hands them over, or its lease ends)",
                    self.member_id,
                    sorted(pending),
                )
            self._said_pending = pending

    def _start_revokes(self, shards: frozenset[int]) -> None:
        """Stop `shards` (in-flight work finishes) while heartbeats go on, then acknowledge
        them (the machine reports them owned until then)."""
        if shards and self._revokes is not None:
            self._revokes.start_soon(self._revoke, shards)

    async def _revoke(self, shards: frozenset[int]) -> None:
        if not shards:
            return
        with trio.CancelScope() as scope:
            self._revoke_scopes[scope] = shards
            try:
                await self.lifecycle.revoke(shards, self.machine.revoke_budget_s())
            finally:
                del self._revoke_scopes[scope]
        if not scope.cancelled_caught:  # else lost meanwhile
            self.machine.revoked(shards)
            self._wakeup.set()  # acknowledge now

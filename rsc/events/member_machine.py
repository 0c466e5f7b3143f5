"""The member side of the protocol as one sans-IO machine (PROTOCOL sections 3-4).

`MemberMachine` is what one member believes and decides; it does no I/O and
reads no clock: every method that depends on time takes `now` (seconds on
any monotonic clock). The shell that drives it (the trio runtime
`rsc.client.member.Member`, `rsc simulate`, the demo, the hypothesis model)
sends the heartbeats it builds, performs the `Steps` it returns, and tells
it what happened:

    request = machine.request(now)              # send it
    steps = machine.receive(request, response, now)   # or machine.failed(request, now)
    ... perform steps: lost, concurrency, stop, start ...
    steps = machine.revoked(shards)             # once stopped shards are idle
    steps = machine.silent(now)                 # when woken with no answer
    machine.next_heartbeat_at(now)              # when to send the next one

Its life is a table, `LIFECYCLE`: `Phase` MEMBER -> LEAVING -> LEFT, or -> REPLACED, moved by
an `Event`; `leaving`, `left` and `replaced` are views of the phase, not flags of their own.

The rules it keeps:

* Reconciliation: shards in `revoke`, and shards it holds that are no longer
  in `assigned`, are stopped (`Steps.stop`) and acknowledged in the next
  heartbeat once the shell reports them idle (`revoked`); it reports them
  owned until then, so the coordinator installs them nowhere else. A shard is
  started (`Steps.start`) only once it is in `assigned`. Revoked shards it
  never started are acknowledged at once.
* SYNC_METADATA: it adopts the stored layout and reports that version.
* FENCED or UNKNOWN_MEMBER: every shard is dropped at once (`Steps.lost`) and
  it rejoins with epoch 0 at once; except FENCED with reason REPLACED (a newer
  process took its static id over): it drops everything and stops for good
  (`replaced`), so that two processes with one id never take turns.
* Static membership (`MemberSettings.static`): its heartbeats say `static`; a
  graceful leave then keeps its shards targeted to it for the group's hold, and
  a new process with its id takes it over at once.
* The lease rule: what it holds is its own until the lease, counted from when
  the last successful heartbeat was *sent*, minus a safety margin
  (`Steps.renew_until`). When no heartbeat has succeeded by then, it drops
  every shard (`silent`, `failed`), even while a request is still in flight.
* Graceful leave (`stop`): its heartbeats say `leaving`; the coordinator
  takes it out of the target and asks it to revoke each shard once the
  shard's next owner is ready (it keeps reading until then, so nothing sits
  idle while the others learn of their new target); once nothing is held, the
  next request is the leave (epoch -1). If the coordinator has not asked for
  everything within `leave_handoff_s`, it revokes the rest itself.
* Push-speed handoff: while its answer only says "wait" (shards targeted to
  it are pending, or shards it holds wait for their next owner) and it has
  nothing to acknowledge, its heartbeat asks the coordinator to hold the
  answer until something changes for it (`waitMs`, a long poll) instead of
  learning of it one interval later. After a long poll that made no progress
  the next heartbeat is due one interval after it was *sent*, so a
  coordinator that does not hold answers is not polled faster.
* Answers it cannot read for a whole lease make it give up: it drops
  everything and leaves (`Steps.gave_up`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from rsc.events.model import (
    EMPTY_LAYOUT,
    ClientInfo,
    DrainProgress,
    FenceReason,
    HeartbeatStatus,
    Layout,
)
from rsc.events.versions import PROTOCOL_VERSION
from rsc.events.wire import DEFAULT_REVOKE_TIMEOUT_MS, MAX_WAIT_MS, HeartbeatRequest, HeartbeatResponse

NOTHING: frozenset[int] = frozenset()


class Phase(enum.Enum):
    """Where a member process is in its life: the only states it has (no loose flags)."""

    #: Joining, or in the group: heartbeating, reconciling, reading what it holds.
    MEMBER = "member"
    #: `stop()` (or it gave up on answers it cannot read): its heartbeats say `leaving`, it
    #: hands each shard over, and once nothing is held the next request is the leave.
    LEAVING = "leaving"
    #: The leave was sent and answered, or went unanswered (the lease ends it): nothing more.
    LEFT = "left"
    #: A newer process took its static member id over: it dropped everything, for good.
    REPLACED = "replaced"


class Event(enum.Enum):
    """What moves a member process from one `Phase` to another."""

    STOP = "stop()"
    UNREADABLE = "no answer could be read for a lease"
    LEAVE_ANSWERED = "the leave (epoch -1) answered"
    LEAVE_UNANSWERED = "the leave (epoch -1) failed"
    REPLACED = "FENCED with reason REPLACED"


#: Every transition of the life of a member process; a pair not here leaves the phase as it is
#: (a second `stop()`, anything after the end). Within MEMBER and LEAVING, what it holds moves
#: by the rules of the module's docstring: `owned` (reading or stopping), `revoking` (stopping,
#: a subset of `owned`), `to_ack` (stopped, not yet reported; never in `owned`), `pending`
#: (targeted, held elsewhere), `waiting` (the last answer only said wait: worth a long poll).
LIFECYCLE: Mapping[tuple[Phase, Event], Phase] = {
    (Phase.MEMBER, Event.STOP): Phase.LEAVING,
    (Phase.MEMBER, Event.UNREADABLE): Phase.LEAVING,
    (Phase.LEAVING, Event.UNREADABLE): Phase.LEAVING,
    (Phase.MEMBER, Event.LEAVE_ANSWERED): Phase.LEFT,
    (Phase.LEAVING, Event.LEAVE_ANSWERED): Phase.LEFT,
    (Phase.LEAVING, Event.LEAVE_UNANSWERED): Phase.LEFT,
    (Phase.MEMBER, Event.LEAVE_UNANSWERED): Phase.LEFT,
    (Phase.MEMBER, Event.REPLACED): Phase.REPLACED,
    (Phase.LEAVING, Event.REPLACED): Phase.REPLACED,
}


@attrs.frozen
class MemberSettings:
    #: Self-fence this long before the lease would end (a fraction of the lease).
    safety_margin: float = 0.2
    #: After a failed heartbeat, try again this soon (never later than the interval).
    retry_interval_s: float = 0.5
    #: Until the coordinator says otherwise.
    heartbeat_interval_ms: int = 3_000
    lease_ttl_ms: int = 10_000
    #: Ask the coordinator to hold a heartbeat while shards are pending (long poll).
    long_poll: bool = True
    #: A static member: its member id is a stable instance identity (feature level 4).
    static: bool = False


DEFAULT_SETTINGS = MemberSettings()


@attrs.frozen
class Steps:
    """What the shell must do after one input, in this order: `lost`, `renew_until`,
    `concurrency`, `stop`, `start`."""

    #: Drop these at once, without acknowledging (fenced, self-fenced, gave up).
    lost: frozenset[int] = NOTHING
    #: Stop reading these; in-flight work finishes; then call `revoked(shards)`.
    stop: frozenset[int] = NOTHING
    #: Start reading these, with `layout`.
    start: frozenset[int] = NOTHING
    layout: Layout = EMPTY_LAYOUT
    #: The number of workers the coordinator now allows (None: unchanged).
    concurrency: int | None = None
    #: What it holds is its own until this time (`-inf`: nothing is).
    renew_until: float | None = None
    #: Why, when something went wrong (for the log): one line each.
    warnings: tuple[str, ...] = ()
    #: A heartbeat got no usable answer: why (every time; the shell logs an outage as one
    #: line when it begins and one when it ends, not a line per retry).
    unanswered: str | None = None
    #: The coordinator answered (an outage under way is over).
    answered: bool = False
    #: Set when it gives up for good (answers it cannot read): the shell leaves, then raises.
    gave_up: str | None = None
    #: Set when a newer process took its static member id over: it has stopped for good.
    replaced: str | None = None


NO_STEPS = Steps()


class MemberMachine:
    """One member id of a group: its epoch, what it holds, and when to heartbeat."""

    def __init__(
        self,
        stream_prefix: str,
        group: str,
        member_id: str,
        incarnation: str,
        client: ClientInfo,
        settings: MemberSettings = DEFAULT_SETTINGS,
    ) -> None:
        self.stream_prefix = stream_prefix
        self.group = group
        self.member_id = member_id
        self.incarnation = incarnation
        self.client = client
        self.settings = settings
        self.epoch = 0
        #: Shards it holds: reading, or being stopped (`revoking`) until acknowledged.
        self.owned: frozenset[int] = NOTHING
        self.revoking: frozenset[int] = NOTHING
        #: Stopped shards the coordinator has not yet heard of.
        self.to_ack: frozenset[int] = NOTHING
        #: Targeted shards someone else still holds (from the last answer).
        self.pending: frozenset[int] = NOTHING
        #: The last answer only said "wait" (for pending shards, or for the next owners of
        #: shards it hands over): worth a long poll.
        self.waiting = False
        self.layout: Layout = EMPTY_LAYOUT
        self.metadata_version = 0
        self.interval_s = settings.heartbeat_interval_ms / 1000
        self.lease_s = settings.lease_ttl_ms / 1000
        #: The group's revoke timeout as the last answer said (protocol 2), else the fallback.
        self.revoke_timeout_s = DEFAULT_REVOKE_TIMEOUT_MS / 1000
        self.max_concurrency: int | None = None
        self.status: HeartbeatStatus | None = None
        #: When the last successful heartbeat was sent (None: none yet).
        self.last_ok_sent: float | None = None
        #: Since when heartbeats have failed (None: the last one succeeded).
        self.failing_since: float | None = None
        #: Since when every answer has been one it cannot read.
        self.unintelligible_since: float | None = None
        self.self_fenced = 0
        #: Where it is in its life (`LIFECYCLE`), and why it left MEMBER when a reason says more.
        self.phase = Phase.MEMBER
        self.gave_up: str | None = None
        self._replaced_why: str | None = None
        self._urgent = True
        self._leave_since: float | None = None
        self._sent: tuple[HeartbeatRequest, float] | None = None
        #: When the next heartbeat is due when nothing is urgent.
        self._due_at = float("-inf")

    def _move(self, event: Event) -> None:
        self.phase = LIFECYCLE.get((self.phase, event), self.phase)

    @property
    def leaving(self) -> bool:
        """`stop()` was called (or it gave up): revoking everything, then the leave."""
        return self.phase in (Phase.LEAVING, Phase.LEFT)

    @property
    def left(self) -> bool:
        """Nothing more to do: the leave went, or a newer process has its id."""
        return self.phase in (Phase.LEFT, Phase.REPLACED)

    @property
    def replaced(self) -> str | None:
        """Why it stopped for good when a newer process took its static member id over."""
        return self._replaced_why if self.phase is Phase.REPLACED else None

    # --- outputs -----------------------------------------------------------

    def request(
        self, now: float, drain_progress: tuple[DrainProgress, ...] = (), stalled: frozenset[int] = NOTHING
    ) -> HeartbeatRequest:
        """The heartbeat to send now (the leave once `stop` has revoked everything), marked as
        sent at `now`: its answer goes to `receive`, or its failure to `failed`."""
        request = self.preview(drain_progress, stalled)
        if self.leaving and self._leave_since is None:
            self._leave_since = now
        self._sent = (request, now)
        self._urgent = False
        return request

    def preview(
        self, drain_progress: tuple[DrainProgress, ...] = (), stalled: frozenset[int] = NOTHING
    ) -> HeartbeatRequest:
        """The heartbeat it would send now, without marking anything sent. `stalled`: shards
        the shell cannot read (key, consumer group or owner token gone), reported while held."""
        leave = self.ready_to_leave
        wait_ms = 0
        if self.waiting and self._may_long_poll():
            wait_ms = min(round(self.interval_s * 1000), MAX_WAIT_MS)
        return HeartbeatRequest(
            protocol_version=PROTOCOL_VERSION,
            stream_prefix=self.stream_prefix,
            consumer_group=self.group,
            member_id=self.member_id,
            incarnation=self.incarnation,
            member_epoch=-1 if leave else self.epoch,
            metadata_version=self.metadata_version,
            owned_shards=NOTHING if leave else self.owned,
            revoked_shards=self.to_ack,
            drain_progress=drain_progress,
            client=self.client,
            wait_ms=wait_ms,
            leaving=self.leaving and not leave,
            stalled_shards=NOTHING if leave else stalled & self.owned,
            static=self.settings.static,
        )

    @property
    def ready_to_leave(self) -> bool:
        """Leaving and nothing held any more: the next request is the leave."""
        return self.leaving and not self.owned and not self.left

    def next_heartbeat_at(self, now: float) -> float:
        """When the next heartbeat should go (`now` or earlier: at once)."""
        if self.left:
            return float("inf")
        if self._urgent or self.ready_to_leave:
            return now
        due = min(self._due_at, self.fence_at)
        if self._leave_since is not None and self.owned - self.revoking:
            due = min(due, self._leave_since + self.leave_handoff_s)  # `silent` revokes the rest
        return due

    def answer_deadline(self, sent: float) -> float:
        """Until when to wait for the answer to a request sent at `sent`.

        A heartbeat slower than a lease is worthless; one that arrives after the
        fence cannot save what is held; a leaving member does not wait long.
        """
        deadline = min(self.fence_at, sent + self.lease_s + self._held_s())
        if self.leaving:
            deadline = min(deadline, sent + self.leave_wait_s)
        return deadline

    @property
    def leave_wait_s(self) -> float:
        """How long a leaving member waits for an answer."""
        return max(self.interval_s, 1.0)

    @property
    def fence_at(self) -> float:
        """When it must have stopped everything without a successful heartbeat."""
        if self.last_ok_sent is None or not self.owned:
            return float("inf")
        return self.last_ok_sent + self.lease_s * (1 - self.settings.safety_margin)

    # --- inputs -------------------------------------------------------------

    def receive(self, request: HeartbeatRequest, response: HeartbeatResponse, now: float) -> Steps:
        """The coordinator answered `request`."""
        sent = self._sent_at(request, now)
        self._sent = None
        warnings: list[str] = []
        self.failing_since = self.unintelligible_since = None
        self.last_ok_sent = sent
        self.status = response.status
        self.interval_s = response.heartbeat_interval_ms / 1000
        self.lease_s = response.lease_ttl_ms / 1000
        if response.revoke_timeout_ms is not None:  # protocol 2; else the documented fallback
            self.revoke_timeout_s = response.revoke_timeout_ms / 1000
        if response.layout is not None:
            self.layout = response.layout
        self.metadata_version = response.metadata_version
        self._due_at = (sent if request.wait_ms else now) + self.interval_s
        if request.member_epoch == -1:
            self._move(Event.LEAVE_ANSWERED)
            self.epoch, self.to_ack, self.pending, self.waiting = 0, NOTHING, NOTHING, False
            return Steps(warnings=tuple(warnings), answered=True)
        if response.status is HeartbeatStatus.FENCED and response.fence_reason is FenceReason.REPLACED:
            message = (
                f"replaced: another process joined with member id {self.member_id!r} (static "
                "membership); this one drops every shard and stops"
            )
            self._replaced_why = message
            self._move(Event.REPLACED)  # nothing to leave: the id is the other process's now
            self.epoch = 0
            return attrs.evolve(self._drop_all([message]), answered=True, replaced=message)
        if response.status in (HeartbeatStatus.FENCED, HeartbeatStatus.UNKNOWN_MEMBER):
            if self.owned:
                why = response.fence_reason.value if response.fence_reason else "not a member"
                warnings.append(
                    f"{response.status.value} by the coordinator ({why}); dropping every shard and rejoining"
                )
            self._urgent = True  # rejoin now, with epoch 0
            self.epoch = 0
            return attrs.evolve(self._drop_all(warnings), answered=True)
        self.epoch = response.member_epoch
        self.to_ack -= request.revoked_shards  # the coordinator has them
        concurrency = None
        if response.max_concurrency != self.max_concurrency:
            self.max_concurrency = concurrency = response.max_concurrency
        assignment = response.assignment
        progressed = response.member_epoch != request.member_epoch or assignment.pending != self.pending
        self.pending = assignment.pending
        self.waiting = response.status is HeartbeatStatus.REVOKE_PENDING and not assignment.revoke
        stop = (self.owned - self.revoking) & (assignment.revoke | (self.owned - assignment.assigned))
        self.revoking |= stop
        # Revoked shards never started are acknowledged too: they are not read.
        self.to_ack |= assignment.revoke - self.owned
        # (`assigned` and `revoke` never overlap in a coordinator's answer; if they did, revoke wins.)
        start = NOTHING if self.leaving else assignment.assigned - self.owned - assignment.revoke
        self.owned |= start
        if self.to_ack:
            self._urgent = True  # acknowledge now
        elif self.waiting and self._may_long_poll() and (not request.wait_ms or progressed or start):
            # Wait for the pending shards in a long poll now: the first time they show, and
            # after a long poll that made progress (finite: no busy loop, even if not held).
            self._urgent = True
        return Steps(
            stop=stop,
            start=start,
            layout=self.layout,
            concurrency=concurrency,
            renew_until=sent + self.lease_s * (1 - self.settings.safety_margin),
            warnings=tuple(warnings),
            answered=True,
        )

    def failed(
        self, request: HeartbeatRequest, now: float, why: str, *, unintelligible: bool = False
    ) -> Steps:
        """No usable answer to `request` (transport failure, 5xx, timeout, refusal to retry).

        Retried sooner than the interval; past the fence, every shard is dropped. An answer
        it cannot read for a whole lease makes it give up and leave.
        """
        sent = self._sent_at(request, now)
        self._sent = None
        self._due_at = now + min(self.settings.retry_interval_s, self.interval_s)
        warnings: list[str] = []
        if request.member_epoch == -1:  # a leave not acknowledged: the lease will end it
            self._move(Event.LEAVE_UNANSWERED)
            self.epoch, self.to_ack = 0, NOTHING
            return Steps(warnings=(f"leave not acknowledged (the lease will end it): {why}",))
        if self.failing_since is None:
            self.failing_since = sent
        if unintelligible:
            if self.unintelligible_since is None:
                self.unintelligible_since = sent
                warnings.append(f"cannot read the coordinator's answer: {why}")
            elif now - self.unintelligible_since >= self.lease_s:
                return self._give_up(warnings)
        steps = self.silent(now)
        return attrs.evolve(steps, warnings=(*warnings, *steps.warnings), unanswered=why)

    def silent(self, now: float) -> Steps:
        """Time passed without an answer: the lease rule (drop everything past the fence); and a
        leave that a coordinator does not hand over in time is done by revoking everything."""
        if now < self.fence_at:
            if self._leave_since is not None and now >= self._leave_since + self.leave_handoff_s:
                stop = self.owned - self.revoking
                if stop:
                    self.revoking |= stop
                    return Steps(stop=stop)
            return NO_STEPS
        self.self_fenced += 1
        return self._drop_all(["no heartbeat succeeded within the lease; dropping every shard"])

    def revoke_budget_s(self) -> float:
        """How long in-flight work on shards being revoked may take: the group's revoke
        timeout less a heartbeat interval and a second, left to acknowledge the revoke in
        time (at least half a second)."""
        return max(0.5, self.revoke_timeout_s - self.interval_s - 1.0)

    def revoked(self, shards: frozenset[int]) -> Steps:
        """The shell stopped `shards` (in-flight work finished): acknowledge them now."""
        done = shards & self.revoking
        if done:
            self.revoking -= done
            self.owned -= done
            self.to_ack |= done
            self._urgent = True
        return NO_STEPS

    def stop(self) -> Steps:
        """Leave gracefully: the next heartbeats say so (`leaving`), the coordinator hands each
        shard over once its next owner is ready (a revoke, as in any handoff), and once nothing
        is held the leave (epoch -1) goes. A coordinator that has not asked for everything
        within `leave_handoff_s` of the first such heartbeat (one that does not know `leaving`)
        gets every shard revoked then."""
        self._move(Event.STOP)
        self._urgent = True
        return NO_STEPS

    @property
    def leave_handoff_s(self) -> float:
        """How long a leave may wait for the coordinator to hand its shards over."""
        return 2 * self.interval_s + 1.0

    # --- internals ------------------------------------------------------------

    def _sent_at(self, request: HeartbeatRequest, now: float) -> float:
        """When `request` was sent: what the lease rule counts from."""
        if self._sent is None or self._sent[0] is not request:
            raise ValueError("an answer to a request this machine did not send last (use request())")
        return self._sent[1]

    def _may_long_poll(self) -> bool:
        """Waiting is all it does: nothing to acknowledge or stop, not leaving, not failing."""
        return self.settings.long_poll and not (self.to_ack or self.revoking) and self.failing_since is None

    def _held_s(self) -> float:
        sent = self._sent
        return sent[0].wait_ms / 1000 if sent is not None else 0.0

    def _drop_all(self, warnings: list[str]) -> Steps:
        lost = self.owned
        self.owned = self.revoking = self.to_ack = self.pending = NOTHING
        self.waiting = False
        return Steps(lost=lost, renew_until=float("-inf"), warnings=tuple(warnings))

    def _give_up(self, warnings: list[str]) -> Steps:
        message = (
            f"no answer of the coordinator could be read for {self.lease_s:g} s "
            f"(a coordinator newer than this client {self.client.name} {self.client.version}?); "
            "leaving the group so that its shards move"
        )
        self.gave_up = message
        steps = self._drop_all([*warnings, message])
        self._move(Event.UNREADABLE)
        self._urgent = True
        return attrs.evolve(steps, gave_up=message)

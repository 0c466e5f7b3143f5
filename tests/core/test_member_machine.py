"""The member machine alone: plain inputs and times, no trio, no coordinator."""

from __future__ import annotations

import math

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from rsc.events.member_machine import MemberMachine, MemberSettings
from rsc.events.model import ClientInfo, FenceReason, HeartbeatStatus
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse, ShardAssignment

PENDING = HeartbeatStatus.REVOKE_PENDING
SETTINGS = MemberSettings(heartbeat_interval_ms=1_000, lease_ttl_ms=5_000, retry_interval_s=0.25)


def machine(long_poll: bool = True) -> MemberMachine:
    settings = attrs.evolve(SETTINGS, long_poll=long_poll)
    return MemberMachine("s", "g", "m", "inc", ClientInfo("t", "1"), settings)


def answer(
    status: HeartbeatStatus = HeartbeatStatus.OK,
    epoch: int = 1,
    assigned: set[int] | frozenset[int] = frozenset(),
    pending: set[int] | frozenset[int] = frozenset(),
    revoke: set[int] | frozenset[int] = frozenset(),
    reason: FenceReason | None = None,
) -> HeartbeatResponse:
    return HeartbeatResponse(
        status=status,
        member_epoch=epoch,
        group_epoch=epoch,
        assignment_epoch=epoch,
        heartbeat_interval_ms=1_000,
        lease_ttl_ms=5_000,
        metadata_version=1,
        assignment=ShardAssignment(frozenset(assigned), frozenset(pending), frozenset(revoke)),
        max_concurrency=1,
        fence_reason=reason,
    )


def test_join_start_and_the_lease_rule() -> None:
    m = machine()
    assert m.next_heartbeat_at(0.0) == 0.0  # at once
    request = m.request(0.0)
    assert (request.member_epoch, request.owned_shards, request.wait_ms) == (0, frozenset(), 0)
    steps = m.receive(request, answer(assigned={0, 1}), 0.01)
    assert steps.start == {0, 1}
    assert steps.renew_until == 0.0 + 5.0 * 0.8  # from when it was sent, less the margin
    assert m.next_heartbeat_at(0.01) == 0.01 + 1.0  # an interval after the answer
    assert m.fence_at == 4.0
    assert m.request(1.0).owned_shards == {0, 1}


def test_revoke_is_reported_owned_until_the_shell_says_it_stopped() -> None:
    m = machine()
    m.receive(m.request(0), answer(assigned={0, 1}), 0)
    steps = m.receive(m.request(1), answer(REVOKE := PENDING, assigned={0}, revoke={1}), 1)
    assert REVOKE is PENDING
    assert (steps.stop, steps.start) == ({1}, frozenset())
    request = m.request(2)
    assert (request.owned_shards, request.revoked_shards) == ({0, 1}, frozenset())
    m.revoked(frozenset({1}))
    assert m.next_heartbeat_at(2.5) == 2.5  # acknowledge at once
    request = m.request(2.5)
    assert (request.owned_shards, request.revoked_shards) == ({0}, {1})
    m.receive(request, answer(assigned={0}), 2.6)
    assert m.request(3).revoked_shards == frozenset()  # the coordinator has it


def test_a_revoke_of_a_shard_never_started_is_acknowledged_at_once() -> None:
    m = machine()
    request = m.request(0)
    steps = m.receive(request, answer(PENDING, revoke={3}), 0)
    assert steps.stop == frozenset()
    assert m.request(0).revoked_shards == {3}


def test_fenced_drops_everything_and_rejoins_at_once() -> None:
    m = machine()
    m.receive(m.request(0), answer(epoch=4, assigned={0, 1}), 0)
    steps = m.receive(
        m.request(1), answer(HeartbeatStatus.FENCED, epoch=0, reason=FenceReason.STALE_EPOCH), 1
    )
    assert steps.lost == {0, 1}
    assert steps.renew_until == -math.inf
    assert steps.warnings
    assert m.next_heartbeat_at(1) == 1
    assert (m.request(1).member_epoch, m.owned) == (0, frozenset())


def test_a_static_member_says_so_and_stops_for_good_once_replaced() -> None:
    """FENCED with reason REPLACED: a newer process has its static id; this one drops everything
    and sends nothing more (a rejoin would take the id back: two processes taking turns)."""
    m = MemberMachine("s", "g", "m", "inc", ClientInfo("t", "1"), attrs.evolve(SETTINGS, static=True))
    request = m.request(0)
    assert request.static is True
    m.receive(request, answer(epoch=4, assigned={0, 1}), 0)
    steps = m.receive(m.request(1), answer(HeartbeatStatus.FENCED, epoch=0, reason=FenceReason.REPLACED), 1)
    assert steps.lost == {0, 1}
    assert steps.replaced is not None
    assert "replaced" in steps.replaced
    assert m.replaced == steps.replaced
    assert m.left
    assert m.next_heartbeat_at(1) == math.inf  # nothing more is sent
    assert machine().request(0).static is False  # members are not static unless asked


def test_failed_heartbeats_retry_sooner_and_self_fence_past_the_lease() -> None:
    m = machine()
    m.receive(m.request(0), answer(assigned={0}), 0)
    request = m.request(1)
    steps = m.failed(request, 1.5, "connection refused")
    assert steps.lost == frozenset()
    # Each failure says why; the shell logs the outage (one line when it begins, one at its end).
    assert (steps.unanswered, steps.warnings, steps.answered) == ("connection refused", (), False)
    assert m.next_heartbeat_at(1.5) == 1.5 + 0.25
    assert m.failed(m.request(1.75), 2.0, "again").unanswered == "again"
    assert m.silent(3.9) == m.silent(3.9)  # nothing yet (fence at 4.0)
    assert m.silent(3.9).lost == frozenset()
    steps = m.silent(4.0)
    assert steps.lost == {0}
    assert m.self_fenced == 1
    assert m.epoch == 1  # it may still be a member: its next heartbeat says


def test_a_member_waiting_for_pending_shards_long_polls_at_once() -> None:
    m = machine()
    steps = m.receive(m.request(0), answer(PENDING, assigned={0}, pending={1}), 0.01)
    assert steps.start == {0}
    assert m.next_heartbeat_at(0.01) == 0.01  # the long poll goes now
    request = m.request(0.01)
    assert request.wait_ms == 1_000
    assert m.answer_deadline(0.01) == min(m.fence_at, 0.01 + 5.0 + 1.0)
    # a coordinator that does not hold answers at once: the next one waits an interval from the send
    m.receive(request, answer(PENDING, assigned={0}, pending={1}), 0.02)
    assert m.next_heartbeat_at(0.02) == 0.01 + 1.0


def test_no_long_poll_while_acknowledging_revoking_leaving_or_failing() -> None:
    m = machine()
    m.receive(m.request(0), answer(PENDING, assigned={0, 1}, pending={2}, revoke=set()), 0)
    m.receive(m.request(0), answer(PENDING, assigned={0}, pending={2}, revoke={1}), 0)
    assert m.request(0.1).wait_ms == 0  # revoking
    m.revoked(frozenset({1}))
    assert m.request(0.2).wait_ms == 0  # acknowledging
    m = machine()
    m.receive(m.request(0), answer(PENDING, pending={2}), 0)
    m.failed(m.request(0.1), 0.2, "down")
    assert m.request(0.3).wait_ms == 0  # failing
    m = machine(long_poll=False)
    m.receive(m.request(0), answer(PENDING, pending={2}), 0)
    assert m.request(0.3).wait_ms == 0
    assert m.next_heartbeat_at(0.3) == 1.0


def test_graceful_leave_hands_over_what_it_is_asked_then_sends_epoch_minus_one() -> None:
    m = machine()
    m.receive(m.request(0), answer(epoch=3, assigned={0, 1}), 0)
    assert m.stop().stop == frozenset()  # it keeps reading until the coordinator asks
    request = m.request(0.1)
    assert (request.member_epoch, request.leaving, request.owned_shards) == (3, True, {0, 1})
    wait = m.receive(request, answer(PENDING, epoch=3, assigned={0, 1}), 0.2)  # next owners not ready
    assert wait.stop == frozenset()
    assert m.request(0.3).wait_ms == 1_000  # it waits in a long poll for the handover
    steps = m.receive(m.request(0.3), answer(PENDING, epoch=3, assigned={0}, revoke={1}), 0.4)
    assert steps.stop == {1}
    later = m.receive(m.request(0.5), answer(epoch=3, assigned={0, 2}, revoke={1}), 0.6)
    assert later.start == frozenset()  # nothing new starts while leaving
    m.revoked(frozenset({1}))
    steps = m.receive(m.request(0.7), answer(PENDING, epoch=3, revoke={0}), 0.8)
    assert steps.stop == {0}
    m.revoked(frozenset({0}))
    assert m.ready_to_leave
    leave = m.request(0.9)
    assert (leave.member_epoch, leave.owned_shards, leave.revoked_shards) == (-1, frozenset(), {0})
    m.receive(leave, answer(epoch=-1), 0.91)
    assert m.left
    assert m.next_heartbeat_at(1.0) == math.inf


def test_a_leave_the_coordinator_does_not_hand_over_revokes_everything_in_time() -> None:
    """A coordinator that ignores `leaving` (an older one): after `leave_handoff_s`."""
    m = machine(long_poll=False)
    m.receive(m.request(0), answer(epoch=3, assigned={0, 1}), 0)
    m.stop()
    first = m.request(1.0)
    m.receive(first, answer(epoch=3, assigned={0, 1}), 1.0)
    assert m.leave_handoff_s == 3.0
    assert m.next_heartbeat_at(1.5) == 2.0  # its next heartbeat, before the fallback
    assert m.silent(3.9).stop == frozenset()
    assert m.silent(4.0).stop == {0, 1}
    m.revoked(frozenset({0, 1}))
    assert m.request(4.1).member_epoch == -1


def test_answers_it_cannot_read_for_a_lease_make_it_give_up_and_leave() -> None:
    m = machine()
    m.receive(m.request(0), answer(assigned={0}), 0)
    m.failed(m.request(1), 1.1, "garbled", unintelligible=True)
    steps = m.failed(m.request(6.0), 6.1, "garbled", unintelligible=True)
    assert steps.gave_up is not None
    assert steps.lost == {0}
    assert m.request(6.2).member_epoch == -1


responses = st.builds(
    answer,
    status=st.sampled_from(list(HeartbeatStatus)),
    epoch=st.integers(0, 5),
    assigned=st.frozensets(st.integers(0, 7)),
    pending=st.frozensets(st.integers(0, 7)),
    revoke=st.frozensets(st.integers(0, 7)),
)
inputs = st.lists(
    st.one_of(
        st.tuples(st.just("receive"), responses),
        st.tuples(st.just("failed"), st.booleans()),
        st.tuples(st.just("revoked"), st.frozensets(st.integers(0, 7))),
        st.tuples(st.just("stop"), st.none()),
        st.tuples(st.just("silent"), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(inputs, st.lists(st.floats(0, 3), min_size=40, max_size=40))
def test_whatever_it_is_told_what_it_holds_stays_consistent(
    steps_in: list[tuple[str, object]], gaps: list[float]
) -> None:
    """Shards it stops are ones it holds; it starts only what it does not hold, never while
    leaving; nothing it holds is also waiting for an ack; what it reports is what it holds."""
    m = machine()
    now = 0.0
    reading: set[int] = set()  # what a shell performing the steps would read
    stopping: set[int] = set()
    for (kind, arg), gap in zip(steps_in, gaps, strict=False):
        now += gap
        if m.left:
            break
        request: HeartbeatRequest = m.request(now)
        if request.member_epoch != -1:  # it reports what the shell reads (tracked apart from it)
            assert request.owned_shards == reading
        match kind:
            case "receive":
                assert isinstance(arg, HeartbeatResponse)
                steps = m.receive(request, arg, now)
            case "failed":
                steps = m.failed(request, now, "x", unintelligible=bool(arg))
            case "revoked":
                assert isinstance(arg, frozenset)
                steps = m.revoked(arg)
                reading -= arg & stopping
                stopping -= arg
            case "stop":
                steps = m.stop()
            case _:
                steps = m.silent(now)
        assert steps.stop <= reading - stopping
        assert not (steps.start & reading)
        assert not (steps.start and m.leaving)
        reading = (reading - steps.lost) | steps.start
        stopping = (stopping - steps.lost) | steps.stop
        assert m.owned == reading
        assert m.revoking == stopping
        assert not (m.to_ack & m.owned)


def test_the_revoke_budget_follows_the_answers_revoke_timeout() -> None:
    """In-flight work on revoked shards gets what the group's revoke timeout leaves once the
    revoke is acknowledged: the timeout less a heartbeat interval and a second; 60 s assumed
    from a coordinator that does not say (protocol version 1, or an older release)."""
    m = machine()
    assert m.revoke_budget_s() == 60.0 - 1.0 - 1.0  # before any answer: the fallback
    m.receive(m.request(0), answer(assigned={0}), 0)
    assert m.revoke_budget_s() == 60.0 - 1.0 - 1.0  # an answer without revokeTimeoutMs
    m.receive(m.request(1), attrs.evolve(answer(assigned={0}), revoke_timeout_ms=10_000), 1)
    assert m.revoke_budget_s() == 10.0 - 1.0 - 1.0
    m.receive(m.request(2), attrs.evolve(answer(assigned={0}), revoke_timeout_ms=1_000), 2)
    assert m.revoke_budget_s() == 0.5  # never less than half a second


def test_the_life_of_a_member_is_a_table() -> None:
    """`LIFECYCLE` is every transition: the ends have none out, LEFT is reached only by a leave
    (answered or not), REPLACED only by the coordinator's REPLACED; the old flags are views of
    the phase."""
    from rsc.events.member_machine import LIFECYCLE, Event, Phase

    assert not [pair for pair in LIFECYCLE if pair[0] in (Phase.LEFT, Phase.REPLACED)]
    into = {(event, to) for (_, event), to in LIFECYCLE.items()}
    assert {e for e, to in into if to is Phase.LEFT} == {Event.LEAVE_ANSWERED, Event.LEAVE_UNANSWERED}
    assert {e for e, to in into if to is Phase.REPLACED} == {Event.REPLACED}
    m = machine()
    assert (m.phase, m.leaving, m.left, m.replaced) == (Phase.MEMBER, False, False, None)
    m.stop()
    m.stop()  # a second stop changes nothing
    assert (m.phase, m.leaving, m.left) == (Phase.LEAVING, True, False)
    request = m.request(0)
    assert request.member_epoch == -1  # nothing held: the next request is the leave
    m.receive(request, answer(epoch=0), 0)
    assert (m.phase, m.leaving, m.left) == (Phase.LEFT, True, True)
    m.stop()
    assert m.phase is Phase.LEFT

"""Member heartbeats: `POST /v1/heartbeat` (one member) and `POST /v1/heartbeats` (a batch).

Each heartbeat is parsed, authorized on its stream, checked (a bad request is a 400 whether
its group exists or not), rate limited, and handed to its group's actor; the answer is
rendered from the group's state (`rsc.events.respond`). The items of a batch that share a
group go to its actor together, in order; an item refused gets its JSON error in its place.
A long poll (`waitMs`) is held outside the timing (`rsc.http.heartbeats.held`). What a heartbeat
may create or rebuild, what is rate limited, and the answer's shape are
`rsc.events.heartbeat_rules`'.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from quart import Response
from quart_trio import QuartTrio

from rsc import tracing
from rsc.actors.deployment import Deployment, Reply
from rsc.actors.errors import ActorStopped, StoreError
from rsc.config import Settings
from rsc.events import heartbeat_rules, longpoll
from rsc.events.auth import Action, Credential
from rsc.events.commands import Heartbeat
from rsc.events.errors import CoordinationError, http_status
from rsc.events.events import GroupEvent, HeartbeatRejected
from rsc.events.group import validate_heartbeat
from rsc.events.group_state import GroupState
from rsc.events.heartbeat_rules import answered_json
from rsc.events.respond import respond
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from rsc.http.authenticate import Gate
from rsc.http.callers import QuotaTable, caller_key
from rsc.http.errors import ApiError
from rsc.http.heartbeats.held import DeploymentHold
from rsc.http.heartbeats.steady import Remembered, Slot, SteadyHeartbeats
from rsc.http.json_io import EncodedJSON, error_body, json_body, json_response, structure
from rsc.http.metrics import Metrics, refusal_details
from rsc.http.ratelimit import HEARTBEATS, RateLimits
from rsc.redis_errors import first_leaf


@attrs.frozen
class HeartbeatBatch:
    #: Each item is structured on its own (an invalid one gets an error in its place).
    heartbeats: tuple[Any, ...]


#: A batch item worth holding: its request, command, first answer and the group's change version.
_Hold = tuple[HeartbeatRequest, Heartbeat, HeartbeatResponse, int]
#: An item to remember once its group accepted it: its slot, its JSON, its rate-limit key's suffix.
_Unremembered = tuple[Slot, bytes, str]


def add_heartbeat_routes(
    app: QuartTrio,
    deployment: Deployment,
    metrics: Metrics,
    gate: Gate,
    rates: RateLimits,
    quota_of: QuotaTable,
    settings: Settings,
) -> None:
    """`POST /v1/heartbeat` and `POST /v1/heartbeats` (see the module); the holds of long polls
    are `app.extensions["rsc.holds"]` (released when the server stops)."""
    # Held long polls take a connection each: at most half of what the server accepts.
    holds = DeploymentHold(deployment, limit=max(1, settings.max_connections // 2))
    app.extensions["rsc.holds"] = holds
    # (the labelled series looked up once, not on every heartbeat)
    single_seconds = metrics.heartbeat_seconds.labels("single")
    batch_seconds = metrics.heartbeat_seconds.labels("batch")

    answers = HeartbeatAnswers(
        deployment,
        gate,
        rates,
        quota_of,
        holds,
        settings,
        single_seconds,
        batch_seconds,
        metrics.count_answer,
    )
    app.extensions["rsc.heartbeat_answers"] = answers

    # (below Quart, `rsc.http.heartbeats.fast_path` answers both first; these keep them in Quart's
    # routing, for its 405s, and answer alike)
    @app.post("/v1/heartbeat")
    async def heartbeat() -> Response:
        return json_response(await answers.single(json_body), plain=True)

    @app.post("/v1/heartbeats")
    async def heartbeats() -> Response:
        return json_response(await answers.batch(json_body), plain=True)


class HeartbeatAnswers:
    """`POST /v1/heartbeat` and `POST /v1/heartbeats`, whichever path took the request (Quart's
    routes or the fast path below them): a function that reads and parses the body in (it is
    timed with the answer), the answer as plain JSON out,
    refusals raised (`ApiError` for a bad body, a refused caller or a rate limit,
    `CoordinationError` for a refusal of the group, `StoreError` and `ActorStopped` to retry:
    `rsc.http.answers` says how each is answered)."""

    def __init__(
        self,
        deployment: Deployment,
        gate: Gate,
        rates: RateLimits,
        quota_of: QuotaTable,
        holds: DeploymentHold,
        settings: Settings,
        single_seconds: Any,
        batch_seconds: Any,
        count_answer: Callable[[HeartbeatRequest, HeartbeatResponse], None] = lambda body, answer: None,
    ) -> None:
        self.deployment = deployment
        #: Counts each answer decided, by status (`Metrics.count_answer`).
        self.count_answer = count_answer
        self.gate = gate
        self.rates = rates
        self.quota_of = quota_of
        self.holds = holds
        self.auto_groups = settings.auto_create_groups
        self.max_batch_items = settings.max_batch_items
        #: Each member's last item of a batch, parsed and answered (`rsc.http.heartbeats.steady`).
        self.steady = SteadyHeartbeats()
        #: The `rsc_heartbeat_seconds{endpoint}` series of each.
        self.single_seconds = single_seconds
        self.batch_seconds = batch_seconds

    async def single(self, read: Callable[[], Awaitable[Any]]) -> Any:
        """The answer to one member's heartbeat (the JSON `read` returns), as plain JSON."""
        deployment, gate, rates, holds = self.deployment, self.gate, self.rates, self.holds
        with self.single_seconds.time():
            body = structure(await read(), HeartbeatRequest)
            caller = gate.check(Action.MEMBER_HEARTBEAT, body.stream_prefix)
            command = body.to_command(deployment.now_ms())
            validate_heartbeat(command, ids=False)  # a bad request is a 400, group or none
            if heartbeat_rules.limited(body):
                rates.check(HEARTBEATS, caller_key(caller))
                rates.check_member(caller, body, heartbeat_rules.member_key_suffix(body))
            quota = self.quota_of(caller)
            command = heartbeat_rules.with_join_quota(command, quota.limits.members_per_group)
            may_create = gate.may_create(caller)
            create = heartbeat_rules.creates_group(body, self.auto_groups, may_create)
            version = holds.version(body.stream_prefix, body.consumer_group)
            seen = heartbeat_rules.seen_version(body, may_create)
            with tracing.heartbeat_span(body.stream_prefix, body.consumer_group, 1):
                reply = await deployment.ask_group(
                    body.stream_prefix,
                    body.consumer_group,
                    command,
                    create=create,
                    seen_version=seen,
                    rebuild=self.auto_groups,
                    quota=quota,
                )
            response = respond(reply.state, command, reply.events)
        if body.wait_ms:  # a long poll is held outside the timing: that is the decision's cost
            response = await holds.hold(body, command, response, version)
        self.count_answer(body, response)
        level = deployment.known_feature_level()
        return answered_json(response, body.protocol_version, level)

    async def batch(self, read: Callable[[], Awaitable[Any]]) -> Any:
        """The answer to a batch of heartbeats (the JSON `read` returns), as plain JSON: an
        answer or a JSON error in each item's place."""
        with self.batch_seconds.time():
            batch = structure(await read(), HeartbeatBatch)
            with tracing.heartbeat_span(None, None, len(batch.heartbeats)):
                results, held = await _answer_batch(
                    self.deployment,
                    self.gate,
                    batch,
                    self.max_batch_items,
                    self.auto_groups,
                    self.holds,
                    self.quota_of,
                    self.rates,
                    self.steady,
                    self.count_answer,
                )
        if held:  # long polls: the answer goes once every held item has its own
            level = self.deployment.known_feature_level()
            async with trio.open_nursery() as nursery:
                for index, hold in held.items():
                    nursery.start_soon(_held_item, results, index, self.holds, hold, level, self.count_answer)
        return {"responses": results}


async def _held_item(
    results: list[Any],
    index: int,
    holds: DeploymentHold,
    hold: _Hold,
    level: int,
    count_answer: Callable[[HeartbeatRequest, HeartbeatResponse], None],
) -> None:
    response = await holds.hold(*hold)
    count_answer(hold[0], response)
    results[index] = answered_json(response, hold[0].protocol_version, level)


def _check_batch(batch: HeartbeatBatch, max_batch_items: int) -> None:
    if len(batch.heartbeats) > max_batch_items:
        raise ApiError(
            413,
            "BATCH_TOO_LARGE",
            f"a batch carries at most {max_batch_items} heartbeats (max_batch_items); "
            "split it into several requests",
            {"limit": max_batch_items, "items": len(batch.heartbeats)},
        )
    if not all(isinstance(item, dict) for item in batch.heartbeats):
        raise ApiError(400, "INVALID_REQUEST", "every item of heartbeats must be a JSON object")


def _batch_item(
    raw: Any,
    gate: Gate,
    allowed: set[str],
    now_ms: int,
    max_members: int,
    steady: SteadyHeartbeats,
    caller: Credential | None,
    rates: RateLimits,
) -> tuple[HeartbeatRequest, Heartbeat, Remembered | _Unremembered | None]:
    """One item of a batch, parsed, authorized (once per stream), checked and rate limited (its
    member's own limit); a join carries the caller's `members_per_group` quota. An item its
    member sent last time too is not parsed or checked again (`SteadyHeartbeats`): what was
    remembered of it comes back; else what to remember once its group accepted it (None:
    nothing to remember)."""
    slot, text, known = steady.parsed(raw)
    if known is not None:
        body, suffix = known.body, known.key_suffix
    else:  # (a new epoch alone, as in a storm: the rest of the item as remembered)
        moved = steady.epoch_moved(slot, raw, text) if slot is not None else None
        body = moved if moved is not None else structure(raw, HeartbeatRequest)
        suffix = ""
    if body.stream_prefix not in allowed:
        gate.check(Action.MEMBER_HEARTBEAT, body.stream_prefix)
        allowed.add(body.stream_prefix)
    command = body.to_command(now_ms)
    later: _Unremembered | None = None
    if known is None:
        validate_heartbeat(command, ids=False)
        command = heartbeat_rules.with_join_quota(command, max_members)
        if heartbeat_rules.limited(body):
            known_suffix = steady.key_suffix(slot, body.incarnation) if slot is not None else None
            suffix = known_suffix or heartbeat_rules.member_key_suffix(body)
        if slot is not None and body.member_epoch > 0:
            later = (slot, text, suffix)
    if heartbeat_rules.limited(body):  # each member its own limit
        rates.check_member(caller, body, suffix)
    return body, command, known if known is not None else later


async def _answer_batch(
    deployment: Deployment,
    gate: Gate,
    batch: HeartbeatBatch,
    max_batch_items: int,
    auto_groups: bool,
    holds: DeploymentHold,
    quota_of: QuotaTable,
    rates: RateLimits,
    steady: SteadyHeartbeats,
    count_answer: Callable[[HeartbeatRequest, HeartbeatResponse], None],
) -> tuple[list[Any], dict[int, _Hold]]:
    """Answer every item; the items of one group go to its actor together, in order.

    Items that ask for a long poll and are worth holding come back apart (`holds.hold`). An
    item its member sent last time too, answered from the very state it was answered from
    then, gets the same answer (`SteadyHeartbeats`)."""
    _check_batch(batch, max_batch_items)
    results: list[Any] = [None] * len(batch.heartbeats)
    now_ms = deployment.now_ms()
    caller = gate.principal()
    # The caller's heartbeat limit: one token per item of the batch, a leave free.
    rates.check(HEARTBEATS, caller_key(caller), cost=heartbeat_rules.batch_cost(batch.heartbeats))
    may_rebuild = gate.may_create(caller)  # may a member make a lost group rebuilt
    quota = quota_of(caller)
    by_group: dict[tuple[str, str], list[tuple[int, Heartbeat]]] = {}
    bodies: dict[int, HeartbeatRequest] = {}
    allowed: set[str] = set()  # the streams already authorized in this batch
    remembered: dict[int, Remembered | _Unremembered] = {}
    for index, raw in enumerate(batch.heartbeats):
        try:
            body, command, known = _batch_item(
                raw, gate, allowed, now_ms, quota.limits.members_per_group, steady, caller, rates
            )
        except ApiError as error:  # a refused caller (`Refused`) too
            results[index] = error_body(error.code, error.message, error.details, error.status)
            continue
        except CoordinationError as error:
            results[index] = _refused(error)
            continue
        by_group.setdefault((body.stream_prefix, body.consumer_group), []).append((index, command))
        bodies[index] = body
        if known is not None and not body.wait_ms:  # (a long poll's answer is never kept)
            remembered[index] = known
    held: dict[int, _Hold] = {}

    async def one_group(key: tuple[str, str], items: list[tuple[int, Heartbeat]]) -> None:
        version = holds.version(*key)
        try:
            joins = any(
                heartbeat_rules.creates_group(bodies[index], auto_groups, may_rebuild) for index, _ in items
            )
            seen = max(heartbeat_rules.seen_version(bodies[index], may_rebuild) for index, _ in items)
            replies = await deployment.ask_group_many(
                *key,
                [command for _, command in items],
                create=joins,
                seen_version=seen,
                rebuild=auto_groups,
                quota=quota,
            )
        except CoordinationError as error:
            for index, _ in items:
                results[index] = _refused(error)
            return
        level = deployment.known_feature_level()
        for (index, command), reply in zip(items, replies, strict=True):
            if isinstance(reply, CoordinationError):
                results[index] = _refused(reply)
                continue
            known = remembered.get(index)
            if known is not None and not any(type(e) is HeartbeatRejected for e in reply.events):
                if not isinstance(known, Remembered):  # accepted: remembered from now on
                    known = steady.remember(*known, bodies[index])
                if known is not None:
                    results[index] = _steady_answer(steady, known, reply, command, level, count_answer)
                    continue
            hold = (index, held, version)
            results[index] = _fresh_answer(bodies[index], command, reply, hold, level, count_answer)

    await _each_group(by_group, one_group)
    return results, held


def _fresh_answer(
    body: HeartbeatRequest,
    command: Heartbeat,
    reply: Reply[GroupState, GroupEvent],
    hold: tuple[int, dict[int, _Hold], int],
    level: int,
    count_answer: Callable[[HeartbeatRequest, HeartbeatResponse], None],
) -> Any:
    """An item's answer, decided now: counted, or kept in `hold` to be held (a long poll worth
    holding: counted once held) at its index."""
    response = respond(reply.state, command, reply.events)
    index, held, version = hold
    if longpoll.should_hold(body, response):
        held[index] = (body, command, response, version)
        return None
    count_answer(body, response)
    return answered_json(response, body.protocol_version, level)


def _refused(error: CoordinationError) -> dict[str, Any]:
    """An item's JSON error for a refusal of its group."""
    return error_body(error.code, error.message, refusal_details(error), http_status(error.code))


def _steady_answer(
    steady: SteadyHeartbeats,
    known: Remembered,
    reply: Reply[GroupState, GroupEvent],
    command: Heartbeat,
    level: int,
    count_answer: Callable[[HeartbeatRequest, HeartbeatResponse], None],
) -> EncodedJSON:
    """The answer to a remembered item that was not refused: as last time if the group's state
    is the very same object (and the level too: not counted again), else rendered, counted and
    kept."""
    answer = steady.answer(known, reply.state, level)
    if answer is None:
        response = respond(reply.state, command, reply.events)
        count_answer(known.body, response)
        answered = answered_json(response, known.body.protocol_version, level)
        answer = steady.keep_answer(known, reply.state, level, answered)
    return answer


async def _each_group(
    by_group: dict[tuple[str, str], list[tuple[int, Heartbeat]]],
    one_group: Callable[[tuple[str, str], list[tuple[int, Heartbeat]]], Awaitable[None]],
) -> None:
    """`one_group` for every group of a batch, side by side. Raises a `StoreError` or
    `ActorStopped` of any (answered 503: the client retries the whole batch)."""
    if len(by_group) == 1:  # (most batches: one process's members of one group)
        await one_group(*next(iter(by_group.items())))
        return
    try:
        async with trio.open_nursery() as nursery:
            for key, items in by_group.items():
                nursery.start_soon(one_group, key, items)
    except BaseExceptionGroup as group:
        retry, _ = group.split((StoreError, ActorStopped))
        if retry is None:
            raise
        raise first_leaf(retry) from group

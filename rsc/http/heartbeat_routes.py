"""Member heartbeats: `POST /v1/heartbeat` (one member) and `POST /v1/heartbeats` (a batch).

Each heartbeat is parsed, authorized on its stream, checked (a bad request is a 400 whether
its group exists or not), rate limited, and handed to its group's actor; the answer is
rendered from the group's state (`rsc.events.respond`). The items of a batch that share a
group go to its actor together, in order; an item refused gets its JSON error in its place.
A long poll (`waitMs`) is held outside the timing (`rsc.http.held_answers`). What a heartbeat
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

from rsc.actors.errors import ActorStopped, StoreError
from rsc.actors.registry import Registry
from rsc.config import Settings
from rsc.connect import first_leaf
from rsc.events import heartbeat_rules, longpoll
from rsc.events.auth import Action
from rsc.events.commands import Heartbeat
from rsc.events.errors import CoordinationError, http_status
from rsc.events.group import validate_heartbeat
from rsc.events.heartbeat_rules import answered_json
from rsc.events.respond import respond
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from rsc.http.authenticate import Gate
from rsc.http.callers import QuotaTable, caller_key
from rsc.http.errors import ApiError
from rsc.http.held_answers import RegistryHold
from rsc.http.json_io import error_body, json_body, json_response, structure
from rsc.http.metrics import Metrics, refusal_details
from rsc.http.ratelimit import HEARTBEATS, PARTY, RateLimits


@attrs.frozen
class HeartbeatBatch:
    #: Each item is structured on its own (an invalid one gets an error in its place).
    heartbeats: tuple[Any, ...]


#: A batch item worth holding: its request, command, first answer and the group's change version.
_Hold = tuple[HeartbeatRequest, Heartbeat, HeartbeatResponse, int]


def add_heartbeat_routes(
    app: QuartTrio,
    registry: Registry,
    metrics: Metrics,
    gate: Gate,
    rates: RateLimits,
    quota_of: QuotaTable,
    settings: Settings,
) -> None:
    """`POST /v1/heartbeat` and `POST /v1/heartbeats` (see the module); the holds of long polls
    are `app.extensions["rsc.holds"]` (released when the server stops)."""
    # Held long polls take a connection each: at most half of what the server accepts.
    holds = RegistryHold(registry, limit=max(1, settings.max_connections // 2))
    app.extensions["rsc.holds"] = holds
    # (the labelled series looked up once, not on every heartbeat)
    single_seconds = metrics.heartbeat_seconds.labels("single")
    batch_seconds = metrics.heartbeat_seconds.labels("batch")

    answers = HeartbeatAnswers(
        registry, gate, rates, quota_of, holds, settings, single_seconds, batch_seconds
    )
    app.extensions["rsc.heartbeat_answers"] = answers

    # (below Quart, `rsc.http.fast_heartbeat` answers both first; these keep them in Quart's
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
        registry: Registry,
        gate: Gate,
        rates: RateLimits,
        quota_of: QuotaTable,
        holds: RegistryHold,
        settings: Settings,
        single_seconds: Any,
        batch_seconds: Any,
    ) -> None:
        self.registry = registry
        self.gate = gate
        self.rates = rates
        self.quota_of = quota_of
        self.holds = holds
        self.auto_groups = settings.auto_create_groups
        self.max_batch_items = settings.max_batch_items
        #: The `rsc_heartbeat_seconds{endpoint}` series of each.
        self.single_seconds = single_seconds
        self.batch_seconds = batch_seconds

    async def single(self, read: Callable[[], Awaitable[Any]]) -> Any:
        """The answer to one member's heartbeat (the JSON `read` returns), as plain JSON."""
        registry, gate, rates, holds = self.registry, self.gate, self.rates, self.holds
        with self.single_seconds.time():
            body = structure(await read(), HeartbeatRequest)
            caller = gate.check(Action.MEMBER_HEARTBEAT, body.stream_prefix)
            command = body.to_command(registry.clock.now_ms())
            validate_heartbeat(command, ids=False)  # a bad request is a 400, group or none
            if heartbeat_rules.limited(body):
                rates.check(HEARTBEATS, caller_key(caller))
                rates.check(PARTY, heartbeat_rules.member_key(caller, body))
            quota = self.quota_of(caller)
            command = heartbeat_rules.with_join_quota(command, quota.limits.members_per_group)
            may_create = gate.may_create(caller)
            create = heartbeat_rules.creates_group(body, self.auto_groups, may_create)
            version = holds.version(body.stream_prefix, body.consumer_group)
            seen = heartbeat_rules.seen_version(body, may_create)
            reply = await registry.ask_group(
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
        level = registry.known_feature_level()
        return answered_json(response, body.protocol_version, level)

    async def batch(self, read: Callable[[], Awaitable[Any]]) -> Any:
        """The answer to a batch of heartbeats (the JSON `read` returns), as plain JSON: an
        answer or a JSON error in each item's place."""
        with self.batch_seconds.time():
            batch = structure(await read(), HeartbeatBatch)
            results, held = await _answer_batch(
                self.registry,
                self.gate,
                batch,
                self.max_batch_items,
                self.auto_groups,
                self.holds,
                self.quota_of,
                self.rates,
            )
        if held:  # long polls: the answer goes once every held item has its own
            level = self.registry.known_feature_level()
            async with trio.open_nursery() as nursery:
                for index, hold in held.items():
                    nursery.start_soon(_held_item, results, index, self.holds, hold, level)
        return {"responses": results}


async def _held_item(results: list[Any], index: int, holds: RegistryHold, hold: _Hold, level: int) -> None:
    response = await holds.hold(*hold)
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
    raw: Any, gate: Gate, allowed: set[str], now_ms: int, max_members: int
) -> tuple[HeartbeatRequest, Heartbeat]:
    """One item of a batch, parsed, authorized (once per stream) and checked; a join carries
    the caller's `members_per_group` quota."""
    body = structure(raw, HeartbeatRequest)
    if body.stream_prefix not in allowed:
        gate.check(Action.MEMBER_HEARTBEAT, body.stream_prefix)
        allowed.add(body.stream_prefix)
    command = body.to_command(now_ms)
    validate_heartbeat(command, ids=False)
    return body, heartbeat_rules.with_join_quota(command, max_members)


async def _answer_batch(
    registry: Registry,
    gate: Gate,
    batch: HeartbeatBatch,
    max_batch_items: int,
    auto_groups: bool,
    holds: RegistryHold,
    quota_of: QuotaTable,
    rates: RateLimits,
) -> tuple[list[Any], dict[int, _Hold]]:
    """Answer every item; the items of one group go to its actor together, in order.

    Items that ask for a long poll and are worth holding come back apart (`holds.hold`)."""
    _check_batch(batch, max_batch_items)
    results: list[Any] = [None] * len(batch.heartbeats)
    now_ms = registry.clock.now_ms()
    caller = gate.principal()
    # The caller's heartbeat limit: one token per item of the batch, a leave free.
    rates.check(HEARTBEATS, caller_key(caller), cost=heartbeat_rules.batch_cost(batch.heartbeats))
    may_rebuild = gate.may_create(caller)  # may a member make a lost group rebuilt
    quota = quota_of(caller)
    by_group: dict[tuple[str, str], list[tuple[int, Heartbeat]]] = {}
    bodies: dict[int, HeartbeatRequest] = {}
    allowed: set[str] = set()  # the streams already authorized in this batch
    for index, raw in enumerate(batch.heartbeats):
        try:
            body, command = _batch_item(raw, gate, allowed, now_ms, quota.limits.members_per_group)
            if heartbeat_rules.limited(body):  # each member its own limit
                rates.check(PARTY, heartbeat_rules.member_key(caller, body))
        except ApiError as error:  # a refused caller (`Refused`) too
            results[index] = error_body(error.code, error.message, error.details, error.status)
            continue
        except CoordinationError as error:
            results[index] = error_body(
                error.code, error.message, refusal_details(error), http_status(error.code)
            )
            continue
        by_group.setdefault((body.stream_prefix, body.consumer_group), []).append((index, command))
        bodies[index] = body
    held: dict[int, _Hold] = {}

    async def one_group(key: tuple[str, str], items: list[tuple[int, Heartbeat]]) -> None:
        version = holds.version(*key)
        try:
            joins = any(
                heartbeat_rules.creates_group(bodies[index], auto_groups, may_rebuild) for index, _ in items
            )
            seen = max(heartbeat_rules.seen_version(bodies[index], may_rebuild) for index, _ in items)
            replies = await registry.ask_group_many(
                *key,
                [command for _, command in items],
                create=joins,
                seen_version=seen,
                rebuild=auto_groups,
                quota=quota,
            )
        except CoordinationError as error:
            for index, _ in items:
                results[index] = error_body(
                    error.code, error.message, refusal_details(error), http_status(error.code)
                )
            return
        level = registry.known_feature_level()
        for (index, command), reply in zip(items, replies, strict=True):
            if isinstance(reply, CoordinationError):
                results[index] = error_body(
                    reply.code, reply.message, refusal_details(reply), http_status(reply.code)
                )
                continue
            response = respond(reply.state, command, reply.events)
            if longpoll.should_hold(bodies[index], response):
                held[index] = (bodies[index], command, response, version)
            results[index] = answered_json(response, bodies[index].protocol_version, level)

    await _each_group(by_group, one_group)
    return results, held


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

"""The Quart (trio) application: parse, hand a command to an actor, render.

No business logic lives here. Every response carries `X-Request-Id` (the
caller's, or a new one). Every error is JSON `{error, message, requestId,
details}` with a 4xx status for anything the client sent; 503 when Redis
is unavailable; 500 only for a bug, and then without internals.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import typing
import uuid
from typing import Any, TypeVar

import attrs
import cattrs
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from rsc.actors.dataset import DATA_LOSS
from rsc.actors.errors import ActorStopped, NotFinalized, StoreError, UnsupportedSchema
from rsc.actors.features import UnsupportedFeatureLevel
from rsc.actors.health import store_failed
from rsc.actors.registry import Registry
from rsc.config import Settings
from rsc.connect import first_leaf
from rsc.events import auth, codec, longpoll, quotas
from rsc.events.auth import Action
from rsc.events.commands import Heartbeat
from rsc.events.errors import CoordinationError, QuotaExceeded, UnknownGroup, UnknownStream
from rsc.events.group import validate_heartbeat
from rsc.events.model import SURROGATE, MigrationPhase, check_id, check_name
from rsc.events.rates import retry_after_header
from rsc.events.respond import respond, respond_producer
from rsc.events.wire import (
    HeartbeatRequest,
    HeartbeatResponse,
    ProducerHeartbeatRequest,
    ProducerHeartbeatResponse,
    check_protocol_version,
)
from rsc.http import views
from rsc.http.authenticate import PUBLIC_PATHS, AdminAccount, Gate, Refused
from rsc.http.errors import ApiError
from rsc.http.held_answers import RegistryHold
from rsc.http.metrics import QUOTA_REFUSALS, Metrics, scoped_registry
from rsc.http.ratelimit import ADMIN_WRITES, HEARTBEATS, PARTY, VIEWS, RateLimits
from rsc.http.throttle import FailureThrottle, client_key

log = logging.getLogger("rsc.http")
T = TypeVar("T")

_STATUS = {
    "QUOTA_EXCEEDED": 429,  # without Retry-After: a slot frees when something is deleted or leaves
    "INVALID_REQUEST": 400,
    "UNSUPPORTED_PROTOCOL_VERSION": 400,
    "NOT_FOUND": 404,
    "UNKNOWN_STREAM": 404,
    "UNKNOWN_GROUP": 404,
    "INCARNATION_MISMATCH": 409,
    "NOT_EMPTY": 409,
    "DELETED": 409,
    "MIGRATION_IN_PROGRESS": 409,
    "NO_MIGRATION": 409,
    "IMMUTABLE_FIELD": 409,
    "FEATURE_LEVEL_REQUIRED": 409,
    "FEATURE_LEVEL_NOT_SUPPORTED": 409,
    "UNSUPPORTED_FEATURE_LEVEL": 400,
    "PRECONDITION_FAILED": 412,
}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
#: How long `/readyz` waits for Redis before saying it is not ready.
READY_TIMEOUT_S = 1.0
#: The deepest JSON a body may nest (the deepest valid body nests 5 levels).
MAX_JSON_DEPTH = 32


@attrs.frozen
class HeartbeatBatch:
    #: Each item is structured on its own (an invalid one gets an error in its place).
    heartbeats: tuple[Any, ...]


def create_app(registry: Registry, settings: Settings | None = None) -> QuartTrio:
    """The coordinator's HTTP application over `registry` (admin routes are added by `serve`)."""
    settings = settings or Settings()
    app = QuartTrio("rsc")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    metrics = Metrics(registry)

    @app.before_serving
    async def start_sampling() -> None:
        app.add_background_task(metrics.sample_forever, settings.metrics_sample_interval_ms / 1000)

    account = AdminAccount(settings.admin_user, settings.admin_password, settings.admin_password_sha256)
    throttle = FailureThrottle(settings.admin_auth_max_failures, settings.admin_auth_window_s)
    gate = Gate(settings.policy, account, metrics.prometheus, throttle)
    app.extensions["rsc.gate"] = gate
    app.extensions["rsc.admin_quota"] = settings.quota_for(auth.ADMIN)
    rates = RateLimits(
        settings.heartbeat_interval_ms,
        settings.rate_limit_party_per_interval,
        settings.rate_limit_party_burst,
        settings.rate_limit_heartbeats_per_s,
        settings.rate_limit_views_per_s,
        settings.rate_limit_admin_writes_per_s,
    )
    app.extensions["rsc.rates"] = rates
    _add_request_ids_and_errors(app, gate, rates)
    _add_member_routes(app, registry, metrics, gate, settings)
    _add_operator_routes(app, registry, gate)

    @app.get("/metrics")
    async def prometheus() -> Response:
        scope = auth.read_scope(gate.policy, gate.principal(), Action.METRICS)
        source = metrics.prometheus if scope.everything else scoped_registry(metrics.prometheus, scope)
        return Response(generate_latest(source), content_type=CONTENT_TYPE_LATEST)

    return app


#: Paths whose action the path alone decides: a caller without the role is refused before
#: its body is read; heartbeats are authorized again on their streams once parsed.
_COARSE = {
    "/v1/heartbeat": Action.MEMBER_HEARTBEAT,
    "/v1/heartbeats": Action.MEMBER_HEARTBEAT,
    "/v1/producers/heartbeat": Action.PRODUCER_HEARTBEAT,
    "/metrics": Action.METRICS,
}


def _authorize(gate: Gate, rates: RateLimits) -> None:
    """Authorize what the path alone decides (heartbeats are authorized per stream once
    parsed), and apply the per-caller rate limits of views and Admin API writes."""
    path = request.path
    if path in PUBLIC_PATHS:
        return
    if path.startswith("/v1/admin/"):  # the Admin API authenticates (and audits) on its own
        if request.method not in ("GET", "HEAD"):
            rates.check(ADMIN_WRITES, client_key(request.remote_addr))
        return
    action = _COARSE.get(path)
    if action is not None:
        gate.check(action)
        if action is Action.METRICS:
            rates.check(VIEWS, caller_key(gate.principal()))
    elif path.startswith("/v1/streams"):
        parts = path.split("/")  # '', v1, streams, <prefix>, ...
        prefix = parts[3] if len(parts) > 3 and parts[3] else None
        if len(parts) == 5 and parts[4] == "routing":
            gate.check(Action.ROUTING, prefix)
        else:
            gate.check(Action.VIEW, prefix)
        rates.check(VIEWS, caller_key(gate.principal()))
    else:
        gate.principal()  # a bad credential is refused everywhere


def caller_key(caller: auth.Credential | None) -> str:
    """Whose per-caller limits a request uses: its credential's, else its address's."""
    return f"credential:{caller.name}" if caller is not None else f"address:{client_key(request.remote_addr)}"


def member_key(caller: auth.Credential | None, body: HeartbeatRequest) -> str:
    """A member's own rate limit: its names and incarnation, and the credential that speaks
    for it (never the address: behind a proxy every caller shares one). With the incarnation,
    a caller sending heartbeats under another's member id spends only its own tokens. The
    names are checked first: a bucket key is bounded and unambiguous."""
    check_name(body.stream_prefix, "streamPrefix")
    check_name(body.consumer_group, "consumerGroup")
    check_id(body.member_id, "memberId")
    check_id(body.incarnation, "incarnation")
    owner = caller.name if caller is not None else quotas.ANONYMOUS
    return "\n".join((owner, body.stream_prefix, body.consumer_group, body.member_id, body.incarnation))


def producer_key(caller: auth.Credential | None, body: ProducerHeartbeatRequest) -> str:
    """A producer's own rate limit (see `member_key`)."""
    check_name(body.stream_prefix, "streamPrefix")
    check_id(body.producer_id, "producerId")
    owner = caller.name if caller is not None else quotas.ANONYMOUS
    return "\n".join((owner, body.stream_prefix, body.producer_id))


def _add_request_ids_and_errors(app: QuartTrio, gate: Gate, rates: RateLimits) -> None:
    @app.before_request
    async def assign_request_id_and_authorize() -> None:  # one hook: each costs per request
        given = request.headers.get("X-Request-Id", "")
        g.request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        _authorize(gate, rates)

    @app.after_request
    async def echo_request_id(response: Response) -> Response:
        response.headers["X-Request-Id"] = getattr(g, "request_id", "")
        return response

    @app.errorhandler(ApiError)
    async def api_error(error: ApiError) -> Response:
        response = error_response(error.status, error.code, error.message, error.details)
        if isinstance(error, Refused) and error.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="rsc"'
        if error.retry_after_s is not None:
            response.headers["Retry-After"] = retry_after_header(error.retry_after_s)
        return response

    @app.errorhandler(CoordinationError)
    async def refused(error: CoordinationError) -> Response:
        g.error_code = error.code  # (the audit tells a quota refusal from throttling by it)
        return error_response(_STATUS.get(error.code, 400), error.code, error.message, _details(error))

    @app.errorhandler(StoreError)
    async def unavailable(error: StoreError) -> Response:
        if isinstance(error, UnsupportedSchema | UnsupportedFeatureLevel):
            # Written by a newer release: this coordinator must not act on it (an operator's
            # problem: run a release that supports it). Clients retry elsewhere or later.
            log.error("%s", error)
            return error_response(503, "UNSUPPORTED_VERSION", str(error))
        if isinstance(error, NotFinalized):
            log.error("bug: %s", error)
            return error_response(500, "INTERNAL", "internal error: an event the feature level forbids")
        store_failed(log, error, f"store unavailable: {error}")
        return error_response(503, "UNAVAILABLE", "the coordinator's Redis is unavailable; retry")

    @app.errorhandler(ActorStopped)
    async def stopped(error: ActorStopped) -> Response:
        return error_response(503, "UNAVAILABLE", "the aggregate is restarting; retry")

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "BODY_TOO_LARGE"}.get(status, "HTTP_ERROR")
        response = error_response(status, code, error.description or error.name)
        allowed = getattr(error, "valid_methods", None)
        if status == 405 and allowed:
            response.headers["Allow"] = ", ".join(sorted(allowed))  # RFC 9110
        return response

    @app.errorhandler(Exception)
    async def bug(error: Exception) -> Response:
        request_id = getattr(g, "request_id", "")
        log.exception("unhandled error, request id %s, on %s %r", request_id, request.method, request.path)
        return error_response(
            500, "INTERNAL", f"internal error; request id {request_id} is in the server log"
        )


def _seen_version(body: HeartbeatRequest, may_create: bool) -> int:
    """The layout version a member already in its group (not a join, not a leave) says it was
    told: a sign, if Redis holds nothing of the group, that Redis lost it (`Registry.group`).
    0 for a caller that may not create streams and groups: it never makes one rebuilt."""
    return body.metadata_version if may_create and body.member_epoch > 0 else 0


def _add_member_routes(
    app: QuartTrio, registry: Registry, metrics: Metrics, gate: Gate, settings: Settings
) -> None:
    max_batch_items, auto_groups = settings.max_batch_items, settings.auto_create_groups
    # Held long polls take a connection each: at most half of what the server accepts.
    holds = RegistryHold(registry, limit=max(1, settings.max_connections // 2))
    app.extensions["rsc.holds"] = holds
    features = registry.store.features
    rates: RateLimits = app.extensions["rsc.rates"]
    quota_of = QuotaTable(settings)

    @app.post("/v1/heartbeat")
    async def heartbeat() -> Response:
        with metrics.heartbeat_seconds.labels("single").time():
            body = structure(await json_body(), HeartbeatRequest)
            caller = gate.check(Action.MEMBER_HEARTBEAT, body.stream_prefix)
            command = body.to_command(registry.clock.now_ms())
            validate_heartbeat(command, ids=False)  # a bad request is a 400, group or none
            if body.member_epoch != -1:  # a leave is never limited
                rates.check(HEARTBEATS, caller_key(caller))
                rates.check(PARTY, member_key(caller, body))
            quota = quota_of(caller)
            if body.member_epoch == 0:
                command = attrs.evolve(command, max_members=quota.limits.members_per_group)
            # Only a join may create a group (and its stream): a member that is not joining
            # speaks of a group it was in, so a missing group is news to it, not a request.
            create = auto_groups and gate.may_create(caller) and body.member_epoch == 0
            version = holds.version(body.stream_prefix, body.consumer_group)
            seen = _seen_version(body, gate.may_create(caller))
            reply = await registry.ask_group(
                body.stream_prefix,
                body.consumer_group,
                command,
                create=create,
                seen_version=seen,
                rebuild=auto_groups,
                quota=quota,
            )
            response = respond(reply.state, command, reply.events)
        if body.wait_ms:  # a long poll is held outside the timing: that is the decision's cost
            response = await holds.hold(body, command, response, version)
        return json_response(answered_in(response, body.protocol_version, features.level))

    @app.post("/v1/producers/heartbeat")
    async def producer_heartbeat() -> Response:
        with metrics.heartbeat_seconds.labels("producer").time():
            body = structure(await json_body(), ProducerHeartbeatRequest)
            caller = gate.check(Action.PRODUCER_HEARTBEAT, body.stream_prefix)
            timing = registry.settings.timing
            command = body.to_command(registry.clock.now_ms(), timing.lease_ttl_ms)
            if not body.leave:  # a leave is never limited
                rates.check(HEARTBEATS, caller_key(caller))
                rates.check(PARTY, producer_key(caller, body))
            quota = quota_of(caller)
            command = attrs.evolve(command, max_producers=quota.limits.producers_per_stream)
            create = None if gate.may_create(caller) else False
            seen = body.metadata_version if gate.may_create(caller) else 0
            reply = await registry.ask_stream(
                body.stream_prefix, command, create=create, seen_version=seen, quota=quota
            )
            response = respond_producer(reply.state, command, timing.heartbeat_interval_ms)
            return json_response(answered_in(response, body.protocol_version, features.level))

    @app.post("/v1/heartbeats")
    async def heartbeats() -> Response:
        with metrics.heartbeat_seconds.labels("batch").time():
            batch = structure(await json_body(), HeartbeatBatch)
            results, held = await _answer_batch(
                registry, gate, batch, max_batch_items, auto_groups, holds, quota_of, rates
            )
        if held:  # long polls: the answer goes once every held item has its own
            async with trio.open_nursery() as nursery:
                for index, hold in held.items():
                    nursery.start_soon(_held_item, results, index, holds, hold, features.level)
        return json_response({"responses": results}, plain=True)


#: A batch item worth holding: its request, command, first answer and the group's change version.
_Hold = tuple[HeartbeatRequest, Heartbeat, HeartbeatResponse, int]


async def _held_item(results: list[Any], index: int, holds: RegistryHold, hold: _Hold, level: int) -> None:
    response = await holds.hold(*hold)
    results[index] = codec.wire.unstructure(answered_in(response, hold[0].protocol_version, level))


R = TypeVar("R", HeartbeatResponse, ProducerHeartbeatResponse)


def _details(error: CoordinationError) -> dict[str, Any] | None:
    """An error's `details`; a quota refusal is counted (`rsc_quota_refusals_total{quota}`)."""
    if isinstance(error, QuotaExceeded):
        QUOTA_REFUSALS[error.quota] += 1
    return error.details


def answered_in(response: R, requested: int, level: int) -> R:
    """`response` in the protocol version a request of `requested` is answered in: from version
    2 on it names that version and the deployment's feature level; a version 1 answer has
    exactly version 1's shape. (`requested` was checked when the request became a command.)"""
    version = check_protocol_version(requested)
    if version < 2:
        return response
    return attrs.evolve(response, protocol_version=version, feature_level=level)


class QuotaTable:
    """Each caller's quotas, worked out once (they are asked for on every heartbeat)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.anonymous = settings.quota_for(None)
        self.by_name = {c.name: settings.quota_for(c) for c in settings.credentials}

    def __call__(self, caller: auth.Credential | None) -> quotas.Quota:
        if caller is None:
            return self.anonymous
        found = self.by_name.get(caller.name) if caller is not auth.ADMIN else None
        return found if found is not None else self.settings.quota_for(caller)


def _charge_batch(batch: HeartbeatBatch, rates: RateLimits, caller: auth.Credential | None) -> None:
    """The caller's heartbeat limit: one token per item of the batch, a leave free."""
    leaves = sum(1 for item in batch.heartbeats if item.get("memberEpoch") == -1)
    rates.check(HEARTBEATS, caller_key(caller), cost=len(batch.heartbeats) - leaves)


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
    if body.member_epoch == 0:
        command = attrs.evolve(command, max_members=max_members)
    return body, command


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
    _charge_batch(batch, rates, caller)
    may_rebuild = gate.may_create(caller)  # may a member make a lost group rebuilt
    create = auto_groups and may_rebuild
    quota = quota_of(caller)
    by_group: dict[tuple[str, str], list[tuple[int, Heartbeat]]] = {}
    bodies: dict[int, HeartbeatRequest] = {}
    allowed: set[str] = set()  # the streams already authorized in this batch
    for index, raw in enumerate(batch.heartbeats):
        try:
            body, command = _batch_item(raw, gate, allowed, now_ms, quota.limits.members_per_group)
            if body.member_epoch != -1:  # each member its own limit; a leave is never limited
                rates.check(PARTY, member_key(caller, body))
        except ApiError as error:  # a refused caller (`Refused`) too
            results[index] = error_body(error.code, error.message, error.details)
            continue
        except CoordinationError as error:
            results[index] = error_body(error.code, error.message, _details(error))
            continue
        by_group.setdefault((body.stream_prefix, body.consumer_group), []).append((index, command))
        bodies[index] = body
    held: dict[int, _Hold] = {}

    async def one_group(key: tuple[str, str], items: list[tuple[int, Heartbeat]]) -> None:
        version = holds.version(*key)
        try:
            joins = create and any(bodies[index].member_epoch == 0 for index, _ in items)
            seen = max(_seen_version(bodies[index], may_rebuild) for index, _ in items)
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
                results[index] = error_body(error.code, error.message, _details(error))
            return
        for (index, command), reply in zip(items, replies, strict=True):
            if isinstance(reply, CoordinationError):
                results[index] = error_body(reply.code, reply.message, _details(reply))
                continue
            response = respond(reply.state, command, reply.events)
            if longpoll.should_hold(bodies[index], response):
                held[index] = (bodies[index], command, response, version)
            response = answered_in(response, bodies[index].protocol_version, registry.store.features.level)
            results[index] = codec.wire.unstructure(response)

    try:
        async with trio.open_nursery() as nursery:
            for key, items in by_group.items():
                nursery.start_soon(one_group, key, items)
    except BaseExceptionGroup as group:
        retry, _ = group.split((StoreError, ActorStopped))
        if retry is None:
            raise
        raise first_leaf(retry) from group  # answered 503: the client retries the whole batch
    return results, held


def _add_operator_routes(app: QuartTrio, registry: Registry, gate: Gate) -> None:
    @app.get("/v1/streams/<stream_prefix>/routing")
    async def routing(stream_prefix: str) -> Response:
        state = await existing_stream(stream_prefix)
        return json_response(views.routing_view(state))

    @app.get("/v1/streams")
    async def streams() -> Response:
        summaries = []
        scope = auth.read_scope(gate.policy, gate.principal(), Action.VIEW)
        for prefix in await registry.stream_prefixes():
            if not scope.sees(prefix):
                continue  # a monitor sees the streams its credential covers
            state = (await registry.stream(prefix, create=False)).state
            if state is not None:
                summaries.append(views.stream_summary(state))
        return json_response({"streams": summaries})

    @app.get("/v1/streams/<stream_prefix>")
    async def stream(stream_prefix: str) -> Response:
        actor = await existing_stream_actor(stream_prefix)
        state = actor.state
        stats = await registry.effects.shard_stats(s.key for s in state.layout.shards if s.readable)
        evidence = await registry.effects.drain_evidence(s.key for s in state.layout.draining)
        consumed = None
        if state.migration is not None and state.migration.phase is MigrationPhase.QUIESCED:
            consumed = await registry.effects.drain_evidence(s.key for s in state.layout.shards if s.readable)
        view = views.stream_view(state, actor.leases, registry.clock.now_ms(), stats, evidence, consumed)
        return json_response(view)

    @app.get("/v1/streams/<stream_prefix>/groups/<consumer_group>")
    async def group(stream_prefix: str, consumer_group: str) -> Response:
        state = await existing_stream(stream_prefix)
        if consumer_group not in state.groups:
            raise ApiError(
                404, "UNKNOWN_GROUP", f"group {consumer_group!r} of {stream_prefix!r} does not exist"
            )
        try:  # a read never creates: a group being deleted is just gone
            actor = await registry.group(stream_prefix, consumer_group, create=False)
        except UnknownGroup as exc:
            raise ApiError(404, "UNKNOWN_GROUP", str(exc)) from exc
        if actor.state is None:
            raise ApiError(404, "UNKNOWN_GROUP", f"group {consumer_group!r} has no state yet")
        return json_response(views.group_view(actor.state, actor.leases, registry.clock.now_ms()))

    async def existing_stream(stream_prefix: str) -> Any:
        return (await existing_stream_actor(stream_prefix)).state

    async def existing_stream_actor(stream_prefix: str) -> Any:
        try:
            return await registry.stream(stream_prefix, create=False)
        except UnknownStream as exc:
            raise ApiError(404, "UNKNOWN_STREAM", str(exc)) from exc

    @app.get("/v1/version")
    async def version() -> Response:
        try:  # read only (a standby answers too; nothing is initialized by a look)
            state = await registry.store.features.peek()
        except StoreError:  # Redis away: the rest is still worth answering
            state = None
        if state is None:
            return json_response(views.version_view())
        return json_response(views.version_view(state.level, state.written))

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        with trio.move_on_after(READY_TIMEOUT_S):
            if await registry.effects.ping():
                try:  # readiness is public: a credential that does not authenticate is nobody here
                    caller = gate.principal()
                except Refused:
                    caller = None
                # Names only for a caller who may see every stream through the views: /readyz
                # is public, so nobody was checked here (read_scope alone assumes a check).
                names = auth.decide(gate.policy, caller, Action.VIEW) is auth.Verdict.ALLOW
                names = names and auth.read_scope(gate.policy, caller, Action.VIEW).everything
                return json_response({"status": "ready", **readiness(registry, names)})
            return error_response(503, "NOT_READY", "Redis refuses connections or fails", {"redis": "down"})
        return error_response(
            503, "NOT_READY", f"Redis did not answer PING within {READY_TIMEOUT_S} s", {"redis": "timeout"}
        )


def readiness(registry: Registry, names: bool = True) -> dict[str, Any]:
    """`/readyz` details: whether every running actor has recovered (loaded and its side
    effects repaired), and what Redis lost (a correction under way stays ready: the fleet's
    heartbeats carry it). The loss reports name streams and keys: only with `names` (a caller
    that may see every stream), else their kinds and times alone."""
    running = registry.running()
    repairing = sum(1 for actor in running if actor.needs_repair)
    loss = DATA_LOSS.details()
    if not names:
        loss["recent"] = [{k: v for k, v in r.items() if k != "what"} for r in loss["recent"]]
    return {
        "actors": {"running": len(running), "recovered": len(running) - repairing, "repairing": repairing},
        "dataLoss": loss,
    }


async def json_body() -> Any:
    """The request body as JSON; 400 if it is not JSON or nests deeper than `MAX_JSON_DEPTH`."""
    data = await request.get_data(as_text=False)
    return parse_json(data if isinstance(data, bytes) else data.encode())


def parse_json(data: bytes | str) -> Any:
    """`data` as JSON; `ApiError` (400) if it is not JSON, nests deeper than `MAX_JSON_DEPTH`
    or holds a lone surrogate."""
    try:
        # Strict decoding (json.loads would let encoded surrogates through): not text, not JSON.
        text = data if isinstance(data, str) else data.decode(json.detect_encoding(data))
        value = _DECODER.decode(text)
    except RecursionError:
        too_deep = True
    except (ValueError, UnicodeDecodeError) as exc:
        why = str(exc)
        if "int_max_str_digits" in why or "Exceeds the limit" in why:  # CPython's words, not JSON's
            why = "a number has more than 4300 digits"
        raise ApiError(400, "MALFORMED_JSON", f"the body is not valid JSON: {why}") from exc
    else:  # no deeper than it has brackets: most bodies need no walk
        brackets = text.count("[") + text.count("{")
        too_deep = brackets > MAX_JSON_DEPTH and nests_deeper(value, MAX_JSON_DEPTH)
        escaped = _SURROGATE_ESCAPE.search(text) or (text is data and SURROGATE.search(text))
        if not too_deep and escaped and _lone_surrogate(value):
            raise ApiError(
                400, "MALFORMED_JSON", "a string holds a lone surrogate (\\ud800-\\udfff), which is not text"
            )
    if too_deep:
        raise ApiError(
            400,
            "JSON_TOO_DEEP",
            f"the body nests deeper than {MAX_JSON_DEPTH} levels",
            {"limit": MAX_JSON_DEPTH},
        )
    return value


#: A JSON escape of a surrogate; only bodies with one need the full check below.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) in `value` holds a surrogate that pairs with nothing.

    Such a string cannot be encoded as UTF-8: stored in Redis or a log it would fail there.
    (A valid pair decodes to one character, so any surrogate left is a lone one.)
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


#: One decoder for every body (`json.loads` with an option builds a new one per call).
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether arrays and objects in `value` nest more than `limit` levels (iterative, no recursion)."""
    if type(value) is not dict and type(value) is not list:
        return False
    level: list[Any] = [value]
    for _ in range(limit):
        below = [
            v
            for item in level
            for v in (item.values() if type(item) is dict else item)
            if type(v) is dict or type(v) is list
        ]
        if not below:
            return False
        level = below
    return True


def structure(data: Any, as_type: type[T]) -> T:
    """`data` as `as_type` through the strict wire converter; 400 with every problem otherwise."""
    if not isinstance(data, dict):
        raise ApiError(400, "INVALID_REQUEST", "the body must be a JSON object")
    try:
        value: T = codec.wire.structure(data, as_type)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            problems = [
                _at_field(_camel_path(p)) for p in cattrs.transform_error(exc, format_exception=_problem)
            ]
        else:
            problems = [str(exc)]
        raise ApiError(400, "INVALID_REQUEST", "the body does not match the schema", problems) from exc
    return value


#: What a wire value of each plain type must be, in the words of JSON rather than Python.
_EXPECTED = {int: "an integer", str: "a string", bool: "true or false", float: "a number"}


def _problem(exc: BaseException, tp: Any) -> str:
    """One problem with one value, named in JSON's terms (never a Python type's name)."""
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "expected one of " + ", ".join(repr(m.value) for m in tp)
    if tp in _EXPECTED:
        return f"expected {_EXPECTED[tp]}"
    said = exc.args[0] if isinstance(exc, ValueError) and exc.args and isinstance(exc.args[0], str) else ""
    if said.startswith("'"):  # an attrs validator: the limit (its other args: attribute, bound)
        if " must match regex " in said:  # the regex itself helps nobody: /openapi.json has it
            said = said.split(" must match regex ")[0] + " does not match its pattern (see /openapi.json)"
        return re.sub(r"'([a-z]+(?:_[a-z]+)*)'", lambda m: repr(codec.camel(m.group(1))), said)
    origin = typing.get_origin(tp)
    if origin in (list, tuple, frozenset, set) or tp in (list, tuple):
        return "expected an array"
    if attrs.has(tp) or origin is dict or tp is dict:
        return "expected an object"
    return "invalid value"


def _at_field(problem: str) -> str:
    """A validator's problem is reported at the object (`@ $`): at the field it names instead."""
    found = re.fullmatch(r"'([A-Za-z]+)' (.*) @ (\$[^ ]*)", problem)
    if found is None:
        return problem
    name, text, where = found.groups()
    return f"{name} {text} @ {where}.{name}"


def _camel_path(problem: str) -> str:
    return re.sub(r"\.([a-z]+(?:_[a-z]+)+)", lambda m: "." + codec.camel(m.group(1)), problem)


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": code, "message": message, "requestId": getattr(g, "request_id", ""), "details": details}


def error_response(status: int, code: str, message: str, details: Any = None) -> Response:
    response = json_response(error_body(code, message, details))
    response.status_code = status
    return response


def json_response(value: Any, plain: bool = False) -> Response:
    """`value` as JSON; `plain` says it is already made of dicts, lists and scalars."""
    data = value if plain else codec.wire.unstructure(value)
    return Response(json.dumps(data, separators=(",", ":")), content_type="application/json")

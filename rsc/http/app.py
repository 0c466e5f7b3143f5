"""The coordinator's HTTP application: its parts wired together, request ids, JSON errors.

No business logic lives here. Every response carries `X-Request-Id` (the
caller's, or a new one). Every error is JSON `{error, message, requestId,
details}` with a 4xx status for anything the client sent; 503 when Redis
is unavailable; 500 only for a bug, and then without internals.

Before any route runs, what the path alone decides is authorized here (heartbeats again per
stream once parsed) and the per-caller rate limits of views and Admin API writes applied.
The routes, one job a module: `heartbeat_routes` (members), `producer_routes`,
`monitoring_routes` (views, `/metrics`, `/v1/version`, probes); the Admin API is
`rsc.http.admin`'s, added by `rsc.http.service`. JSON in and out is `rsc.http.json_io`'s.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from rsc.actors.errors import ActorStopped, NotFinalized, StoreError, UnsupportedSchema
from rsc.actors.features import UnsupportedFeatureLevel
from rsc.actors.health import store_failed
from rsc.actors.registry import Registry
from rsc.config import Settings
from rsc.events import auth
from rsc.events.auth import Action
from rsc.events.errors import CoordinationError, http_status
from rsc.events.rates import retry_after_header
from rsc.http.authenticate import PUBLIC_PATHS, AdminAccount, Gate, Refused
from rsc.http.callers import QuotaTable, caller_key
from rsc.http.errors import ApiError
from rsc.http.heartbeat_routes import add_heartbeat_routes
from rsc.http.json_io import error_response
from rsc.http.metrics import Metrics, refusal_details
from rsc.http.monitoring_routes import add_monitoring_routes
from rsc.http.producer_routes import add_producer_routes
from rsc.http.ratelimit import ADMIN_WRITES, VIEWS, RateLimits
from rsc.http.throttle import FailureThrottle, client_key

log = logging.getLogger("rsc.http")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


#: Request ids this process makes: a random prefix per process and a counter (as unique as a
#: uuid4 per process and start, without a system call for randomness on every request).
_REQUEST_ID_PREFIX = secrets.token_hex(8)
_request_numbers = itertools.count(1)


def _new_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):016x}"


def create_app(registry: Registry, settings: Settings | None = None) -> QuartTrio:
    """The coordinator's HTTP application over `registry` (admin routes are added by `serve`).

    Raises nothing (a bad `settings` was refused when it was loaded)."""
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
    quota_of = QuotaTable(settings)
    _add_request_ids_and_errors(app, gate, rates)
    add_heartbeat_routes(app, registry, metrics, gate, rates, quota_of, settings)
    add_producer_routes(app, registry, metrics, gate, rates, quota_of)
    add_monitoring_routes(app, registry, gate, metrics)
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


def _add_request_ids_and_errors(app: QuartTrio, gate: Gate, rates: RateLimits) -> None:
    @app.before_request
    async def assign_request_id_and_authorize() -> None:  # one hook: each costs per request
        given = request.headers.get("X-Request-Id", "")
        g.request_id = given if _REQUEST_ID.fullmatch(given) else _new_request_id()
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
        return error_response(http_status(error.code), error.code, error.message, refusal_details(error))

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

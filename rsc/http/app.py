"""The coordinator's HTTP application: its parts wired together, request ids, JSON errors.

No business logic lives here. Every response carries `X-Request-Id` (the
caller's, or a new one). Every error is JSON `{error, message, requestId,
details}` with a 4xx status for anything the client sent; 503 when Redis
is unavailable; 500 only for a bug, and then without internals.

Before any route runs, what the path alone decides is authorized here (heartbeats again per
stream once parsed) and the per-caller rate limits of views and Admin API writes applied.
The routes, one job a module: `heartbeats` (members), `producer_routes`,
`monitoring_routes` (views, `/metrics`, `/v1/version`, probes); the Admin API is
`rsc.http.admin`'s, added by `rsc.coordinator_process`. JSON in and out is `rsc.http.json_io`'s.
"""

from __future__ import annotations

import logging

from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from rsc import tracing
from rsc.actors.deployment import Deployment, Registry, as_deployment
from rsc.actors.errors import ActorStopped, StoreError
from rsc.config import Settings
from rsc.events import auth
from rsc.events.auth import Action
from rsc.events.errors import CoordinationError
from rsc.http import exchange
from rsc.http.answers import answer_response, error_answer, http_error_answer
from rsc.http.authenticate import PUBLIC_PATHS, AdminAccount, Gate
from rsc.http.callers import QuotaTable, caller_key
from rsc.http.errors import ApiError
from rsc.http.heartbeats import fast_path as fast_heartbeat
from rsc.http.heartbeats.fast_path import HeartbeatFastPath
from rsc.http.heartbeats.routes import add_heartbeat_routes
from rsc.http.metrics import Metrics
from rsc.http.monitoring_routes import add_monitoring_routes
from rsc.http.producer_routes import add_producer_routes
from rsc.http.ratelimit import ADMIN_WRITES, VIEWS, RateLimits
from rsc.http.throttle import FailureThrottle, client_key

log = logging.getLogger("rsc.http")


class CoordinatorApp(QuartTrio):
    """Quart (on trio) with the heartbeat fast path in front of its ASGI application: a
    request enters through `front` (`rsc.http.heartbeats.fast_path`), which hands everything it does
    not answer to Quart's own `asgi_app`."""

    front: HeartbeatFastPath | None = None

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if self.front is None:
            await self.asgi_app(scope, receive, send)
        else:
            await self.front(scope, receive, send)


def create_app(deployment: Deployment | Registry, settings: Settings | None = None) -> CoordinatorApp:
    """The coordinator's HTTP application over `deployment` (admin routes are added by `serve`;
    a `Registry` is deprecated: `rsc.actors.deployment.as_deployment`).

    Raises nothing (a bad `settings` was refused when it was loaded)."""
    deployment = as_deployment(deployment)
    settings = settings or Settings()
    app = CoordinatorApp("rsc")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    metrics = Metrics(deployment)
    deployment.observe_groups(tracing.trace_group)  # rebalances and layouts as spans (once)

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
    add_heartbeat_routes(app, deployment, metrics, gate, rates, quota_of, settings)
    add_producer_routes(app, deployment, metrics, gate, rates, quota_of)
    add_monitoring_routes(app, deployment, gate, metrics)
    fast = HeartbeatFastPath(app.asgi_app, app.extensions["rsc.heartbeat_answers"], gate, app.config)
    app.extensions[fast_heartbeat.EXTENSION] = fast
    app.front = fast
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
        headers = request.headers
        exchange.begin(
            headers.get("Authorization", ""),
            request.remote_addr,
            exchange.id_for(headers.get("X-Request-Id", "")),
        )
        _authorize(gate, rates)

    @app.after_request
    async def echo_request_id(response: Response) -> Response:
        response.headers["X-Request-Id"] = exchange.request_id()
        return response

    @app.errorhandler(ApiError)
    @app.errorhandler(CoordinationError)
    @app.errorhandler(StoreError)
    @app.errorhandler(ActorStopped)
    async def known_error(error: Exception) -> Response:
        return answer_response(error_answer(error))

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        return answer_response(http_error_answer(error))

    @app.errorhandler(Exception)
    async def bug(error: Exception) -> Response:
        return answer_response(error_answer(error, request.method, request.path))

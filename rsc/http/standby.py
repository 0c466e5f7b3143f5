"""The standby gate: a coordinator that does not hold the lease answers 503 STANDBY.

Only the active coordinator (`rsc.actors.leadership`) runs actors. A standby
answers every request with 503 and

    {"error": "STANDBY", "message": ..., "requestId": ...,
     "details": {"active": "<the active coordinator's advertised URL, or null>"}}

and a `Retry-After` header, except `GET /healthz`, `/metrics`, `/v1/version`
and `/openapi.json`, which describe the process itself. `/readyz` is not
among them: a standby is not ready, so a load balancer sends traffic to the
active one. A standby does not forward requests: clients list every
coordinator and move to the next one on a 503 or a failed connection, which
costs one round trip and keeps a standby free of proxying and of its
failure modes (`rsc.client.coordinator`).

The gate checks twice, on the clock each time: when the request arrives,
and again when its response leaves. The first keeps a standby from asking
anything of actors. The second covers a request that started in an active
term whose deadline passed before its answer was made: the actors are
stopped at the deadline, but a process resumed after a pause (SIGSTOP, a
frozen VM) may run a waiting handler before the task that stops them. An
answer that goes out was therefore made before the deadline, from state
that no other coordinator could have changed yet: a new one acquires the
lease only after it expires in Redis, which is later than the deadline.
"""

from __future__ import annotations

import logging
import socket
from urllib.parse import urlsplit

from quart import Response, g, request
from quart_trio import QuartTrio

from rsc.actors.deployment import Leadership
from rsc.http.answers import ErrorAnswer, answer_response

#: What a standby still answers itself (GET only): facts about the process, not the coordination.
log = logging.getLogger("rsc.standby")
OPEN_PATHS = frozenset({"/healthz", "/metrics", "/v1/version", "/openapi.json"})
#: Seconds a client should wait before asking this coordinator again.
RETRY_AFTER_S = 1


def add_standby_gate(app: QuartTrio, leadership: Leadership) -> None:
    """Answer 503 STANDBY while `leadership` is not active (register it after every other hook);
    the heartbeat fast path below Quart asks `leadership` too."""
    fast = app.extensions.get("rsc.fast_heartbeat")
    if fast is not None:
        fast.leadership = leadership

    @app.before_request
    async def standby_gate() -> Response | None:
        if leadership.active or _open():
            return None
        g.standby_answered = True
        return standby_response(leadership)

    @app.after_request
    async def standby_at_answer(response: Response) -> Response:
        if leadership.active or _open() or getattr(g, "standby_answered", False):
            return response
        return standby_response(leadership)


def standby_response(leadership: Leadership) -> Response:
    """`standby_answer` for the current Quart request. Raises nothing."""
    return answer_response(standby_answer(leadership, request.path))


def standby_answer(leadership: Leadership, path: str) -> ErrorAnswer:
    """The 503 STANDBY answer to a request for `path`, naming the active coordinator when it is
    known. Raises nothing.

    When this process cannot reach Redis, it is not a standby waiting its turn: it
    says that Redis is the cause (503 UNAVAILABLE, `/readyz` NOT_READY) instead.
    """
    retry = (("Retry-After", str(RETRY_AFTER_S)),)
    if leadership.unreachable is not None:
        return ErrorAnswer(
            503,
            "NOT_READY" if path == "/readyz" else "UNAVAILABLE",
            "the coordinator cannot reach its Redis, so it does not act as the active coordinator; retry",
            {"redis": "unreachable", "active": None},
            retry,
        )
    active = leadership.active_elsewhere()
    where = f"; the active coordinator is {active}" if active else ""
    return ErrorAnswer(503, "STANDBY", f"this coordinator is a standby{where}", {"active": active}, retry)


def _open() -> bool:
    return request.method in ("GET", "HEAD") and request.path in OPEN_PATHS


def default_advertise_url(urls: list[str]) -> str | None:
    """The URL clients elsewhere can use to reach this process: the first bound address that
    is not a wildcard, else (bound to 0.0.0.0 or ::) this host's address on that port."""
    wildcard = None
    for url in urls:
        if "://unix:" in url:
            continue  # a Unix socket is nothing a client elsewhere can use
        parts = urlsplit(url)
        host = parts.hostname or ""
        if host not in ("0.0.0.0", "::", ""):
            return url
        wildcard = wildcard or parts
    if wildcard is None:
        return None
    address = _host_address()
    if address is None:
        log.warning(
            "bound to a wildcard address and this host's name resolves to no usable address: "
            "set advertise_url (RSC_ADVERTISE_URL) so that standbys can name this coordinator"
        )
        return None
    url = f"{wildcard.scheme}://{address}:{wildcard.port}"
    log.info("advertising %s to standbys and clients (set advertise_url to change it)", url)
    return url


def _host_address() -> str | None:
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if address.startswith("127.") else address

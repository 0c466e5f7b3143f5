"""Who may call the Admin API, and the audit trail of every call.

Before each request under `/v1/admin/`: HTTP Basic against the admin account, through the
app's gate (whose throttle also counts wrong admin credentials sent to other paths). After
each: one audit record, whatever happened; logins refused as throttled are counted instead
and recorded once per address and window. `GET /v1/admin/audit` reads the records back.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time

import trio
from quart import Response, g, request
from quart_trio import QuartTrio

from rsc.http import exchange, paging
from rsc.http.admin.bodies import int_query, one_value
from rsc.http.audit import AuditFilter, AuditLog, AuditRecord
from rsc.http.authenticate import AdminAccount, Gate, basic_credentials
from rsc.http.errors import ApiError
from rsc.http.json_io import json_response
from rsc.http.throttle import Blocked

log = logging.getLogger("rsc.admin")
OUTCOMES = ("ok", "denied", "rejected", "error", "throttled")
#: The query parameters of `GET /v1/admin/audit`.
AUDIT_FILTERS = frozenset(
    {"caller", "method", "status", "pathPrefix", "outcome", "limit", "requestId", "cursor"}
)
#: A record id (a Redis stream entry id), as an audit cursor carries it.
_RECORD_ID = re.compile(r"\d{1,20}-\d{1,20}")


def add_access_hooks(app: QuartTrio, account: AdminAccount, audit: AuditLog) -> None:
    """Authenticate every request under `/v1/admin/` and audit each (see the module)."""
    gate: Gate = app.extensions["rsc.gate"]
    throttle = gate.throttle

    @app.before_request
    async def authenticate() -> None:
        if not request.path.startswith("/v1/admin/"):
            return
        g.caller = None
        g.revision = None
        gate.refuse_if_throttled()
        header = request.headers.get("Authorization", "")
        g.caller = caller_name(basic_credentials(header)[0], account)
        if not account.enabled:
            raise ApiError(403, "ADMIN_DISABLED", "no admin password is configured (RSC_ADMIN_PASSWORD)")
        # Every refusal counts, with credentials or without: each is an audit record, so an
        # address gets a few individually and then one aggregated record per window.
        if gate.admin_login(header, count_missing=True) is None:
            if basic_credentials(header)[0] is None:
                raise ApiError(401, "UNAUTHENTICATED", "no credentials: admin endpoints need HTTP Basic auth")
            # The same words for an unknown user and a wrong password: no user names leak.
            raise ApiError(401, "UNAUTHENTICATED", "wrong user name or password")

    @app.after_request
    async def record(response: Response) -> Response:
        if request.path.startswith("/v1/admin/"):
            if response.status_code == 401:
                response.headers["WWW-Authenticate"] = admin_challenge()
            if response.status_code == 429 and exchange.current().error_code != "QUOTA_EXCEEDED":
                return response  # throttled logins: counted, and audited once per address and window
            await _audit(audit, response)
        return response

    async def flush_throttled() -> None:
        for blocked in throttle.expired(trio.current_time()):
            await _audit_blocked(audit, blocked)

    async def flush_forever() -> None:
        while True:
            await trio.sleep(min(throttle.window_s, 5.0))
            await flush_throttled()

    @app.before_serving
    async def start_flushing() -> None:
        app.add_background_task(flush_forever)

    @app.after_serving
    async def last_flush() -> None:
        for blocked in throttle.expired(float("inf")):
            await _audit_blocked(audit, blocked)


def add_audit_route(app: QuartTrio, audit: AuditLog) -> None:
    """`GET /v1/admin/audit`: the audit records, filtered by the query (`AUDIT_FILTERS`)."""

    @app.get("/v1/admin/audit")
    async def read_audit() -> Response:
        args = request.args
        unknown = sorted(set(args) - AUDIT_FILTERS)
        if unknown:  # a misspelt filter would silently return everything
            raise ApiError(
                400,
                "INVALID_REQUEST",
                f"unknown query parameter(s) {', '.join(map(repr, unknown))}; "
                f"the filters are {', '.join(sorted(AUDIT_FILTERS))}",
            )
        if args.get("outcome", "ok") not in OUTCOMES:
            raise ApiError(400, "INVALID_REQUEST", f"outcome must be one of {', '.join(OUTCOMES)}")
        for name in AUDIT_FILTERS:
            one_value(name)
        wanted = AuditFilter(
            caller=args.get("caller"),
            method=args.get("method"),
            status=int_query("status", None, 100, 599),
            path_prefix=args.get("pathPrefix"),
            outcome=args.get("outcome"),
            request_id=args.get("requestId"),
            limit=int_query("limit", 100, 1, 1_000) or 100,
            before=_before(args.get("cursor")),
        )
        records, more = await audit.read_page(wanted)
        # Always in pages (100 newest by default, as before pages existed): the cursor of the
        # next, older page, or null.
        last = records[-1].record_id if more and records else None
        cursor = paging.encode_cursor("audit", last) if last else None
        body = {"records": records, "nextCursor": cursor}
        return paging.with_link(json_response(body), cursor, wanted.limit)


def _before(cursor: str | None) -> str | None:
    """The record id an audit cursor points before (None: from the newest). Raises `ApiError` 400."""
    if cursor is None:
        return None
    record_id = paging.decode_cursor("audit", cursor)
    if not _RECORD_ID.fullmatch(record_id):
        raise ApiError(400, "INVALID_CURSOR", "cursor is not one this server gave for audit")
    return record_id


def caller_name(user: str | None, account: AdminAccount) -> str | None:
    """What the audit records as the caller: the user if it is the admin account's, else a keyed hash.

    A password typed into the user field must never be stored, nor anything a dictionary
    could be checked against offline: an unknown user name is recorded only as
    `unknown-user:<12 hex of an HMAC-SHA256 keyed by the admin password's hash>`, the same
    for the same name while the password stays, so repeated attempts can be told apart.
    """
    if user is None or user == account.user:
        return user
    key = ("rsc-audit:" + account.secret_digest).encode()
    return "unknown-user:" + hmac.new(key, user.encode(), hashlib.sha256).hexdigest()[:12]


def admin_challenge() -> str:
    """The admin's 401 challenge: HTTP Basic, except for a page's script (`X-Requested-With:
    XMLHttpRequest`, as `/ui` sends), where a Basic challenge would make the browser open its
    own login dialog over the page (and hold the request): the page asks for it itself."""
    if request.headers.get("X-Requested-With") == "XMLHttpRequest":
        return 'RscBasic realm="rsc admin"'
    return 'Basic realm="rsc admin"'


def _outcome(status: int, code: str | None = None) -> str:
    if status < 400:
        return "ok"
    if code == "QUOTA_EXCEEDED":  # refused for what it asked, not for how often
        return "rejected"
    if status == 429:
        return "throttled"
    if status in (401, 403):
        return "denied"
    return "rejected" if status < 500 else "error"


async def _audit(audit: AuditLog, response: Response) -> None:
    try:
        data = await request.get_data(as_text=False)
        body = data if isinstance(data, bytes) else data.encode()
    except Exception:  # the body may be unreadable (too large): fingerprint nothing
        body = b""
    entry = AuditRecord(
        time_ms=audit_now_ms(),
        request_id=exchange.request_id(),
        caller=getattr(g, "caller", None),
        remote_address=request.remote_addr,
        method=request.method,
        path=request.path,
        status=response.status_code,
        outcome=_outcome(response.status_code, exchange.current().error_code),
        body_sha256=hashlib.sha256(body).hexdigest(),
        revision=getattr(g, "revision", None),
    )
    try:
        await audit.record(entry)
    except Exception:
        log.exception("could not write the audit record %s", entry)


async def _audit_blocked(audit: AuditLog, blocked: Blocked) -> None:
    """One record for every admin request an address had refused with 429 in one window."""
    entry = AuditRecord(
        time_ms=audit_now_ms(),
        request_id="",
        caller=None,
        remote_address=blocked.address,
        method="*",
        path="/v1/admin/",
        status=429,
        outcome="throttled",
        body_sha256=hashlib.sha256(b"").hexdigest(),
        count=blocked.blocked,
    )
    try:
        await audit.record(entry)
    except Exception:
        log.exception("could not write the audit record %s", entry)


def audit_now_ms() -> int:
    """The wall clock in milliseconds: when an audit record was made."""
    return time.time_ns() // 1_000_000

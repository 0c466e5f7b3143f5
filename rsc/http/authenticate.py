"""Authentication at the HTTP edge; the decisions are `rsc.events.auth.decide`'s.

Callers present `Authorization: Bearer <token>` (members, producers,
monitors) or HTTP Basic (the admin). A request that presents a credential
that does not authenticate is refused with 401 whatever it asks for, so a
typo never silently falls back to anonymous access. Refusals of member,
producer and view requests are counted in `rsc_auth_refusals_total`, not
audited one by one (the Admin API audits its own).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
from collections.abc import Callable

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter

from rsc.events import auth
from rsc.events.auth import Action, Credential, Policy, Verdict
from rsc.http import exchange
from rsc.http.errors import ApiError
from rsc.http.throttle import FailureThrottle, client_key

#: What Quart gives as the remote address of a Unix socket peer.
UNIX_PEER = "<local>"
#: Paths nobody needs a credential for.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/v1/version", "/openapi.json", "/", "/ui", "/docs"})


class Refused(ApiError):
    """An authentication or authorization refusal (401/403/429), counted in the metrics."""


@attrs.frozen
class AdminAccount:
    """The one admin account (HTTP Basic); compared in constant time."""

    user: str
    password: str | None = None
    password_sha256: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.password or self.password_sha256)

    @property
    def secret_digest(self) -> str:
        """The SHA-256 of the password (what keys hashes that must not be checked offline)."""
        if self.password_sha256:
            return self.password_sha256.lower()
        return hashlib.sha256((self.password or "").encode()).hexdigest()

    def check(self, user: str, password: str) -> bool:
        user_ok = hmac.compare_digest(user.encode(), self.user.encode())
        if self.password_sha256:
            digest = hashlib.sha256(password.encode()).hexdigest()
            password_ok = hmac.compare_digest(digest, self.password_sha256.lower())
        else:
            password_ok = hmac.compare_digest(password.encode(), (self.password or "").encode())
        return user_ok and password_ok and self.enabled


class Gate:
    """Authenticates each request once (`Exchange.principal`) and authorizes actions on streams."""

    def __init__(
        self,
        policy: Policy,
        account: AdminAccount,
        prometheus: CollectorRegistry,
        throttle: FailureThrottle | None = None,
    ) -> None:
        self.policy = policy
        self.account = account
        #: Wrong admin passwords count against their address wherever they are sent.
        self.throttle = throttle or FailureThrottle()
        self.refusals = Counter(
            "rsc_auth_refusals",
            "Requests refused by authentication or authorization (admin ones are also audited)",
            ["action", "reason"],
            registry=prometheus,
        )

    def principal(self, action: Action | None = None) -> Credential | None:
        """The authenticated caller of this request (None: anonymous); 401 for a bad credential.

        Authenticated once per request (the result is kept in its `Exchange`)."""
        ctx = exchange.current()
        cached = ctx.principal
        if not isinstance(cached, exchange.Unset):
            return cached
        found: Credential | None = None
        header = ctx.authorization
        if header:
            scheme, _, value = header.partition(" ")
            basic = scheme.lower() == "basic"
            if scheme.lower() == "bearer" and value.strip():
                found = self.policy.authenticate(value.strip())
            elif basic:
                if not self.account.enabled:  # the same answer as the Admin API's
                    ctx.principal = None
                    raise self._refuse(
                        action,
                        "admin-disabled",
                        403,
                        "ADMIN_DISABLED",
                        "no admin password is configured (RSC_ADMIN_PASSWORD)",
                    )
                found = self._admin(header)
            if found is None:
                ctx.principal = None
                # The Admin API's words for a wrong admin login (the same for an unknown user).
                message = (
                    "wrong user name or password" if basic else "the credential in Authorization is not valid"
                )
                raise self._refuse(action, "bad-credential", 401, "UNAUTHENTICATED", message)
        ctx.principal = found
        return found

    def _admin(self, header: str) -> Credential | None:
        """The admin, if the Basic credentials are right; throttled like the Admin API's logins."""
        self.refuse_if_throttled()
        return self.admin_login(header)

    def refuse_if_throttled(self) -> None:
        """429 when this request's address used up its admin login budget (views and Admin API alike)."""
        address = client_key(exchange.current().remote_addr)
        wait = self.throttle.retry_after(address, trio.current_time())
        if wait is not None:
            raise Refused(
                429,
                "TOO_MANY_FAILURES",
                f"too many failed admin logins from {address}; retry in {wait:.0f} s",
                {"retryAfterS": wait},
                retry_after_s=wait,
            )

    def admin_login(self, header: str, *, count_missing: bool = False) -> Credential | None:
        """The admin, if `header` holds its Basic credentials; a failure counts against the address
        (a missing credential too, with `count_missing`)."""
        user, password = basic_credentials(header)
        if user is not None and password is not None and self.account.check(user, password):
            return auth.ADMIN
        if user is not None or count_missing:
            self.throttle.failed(client_key(exchange.current().remote_addr), trio.current_time())
        return None

    def check(self, action: Action, stream_prefix: str | None = None) -> Credential | None:
        """Authorize `action` on `stream_prefix` for this request's caller; raise `Refused`."""
        caller = self.principal(action)
        policy = self.policy
        # The peer address matters only for anonymous callers in protected mode: parse it then.
        loopback = caller is not None or policy.enforced or policy.insecure or _from_loopback()
        verdict = auth.decide(policy, caller, action, stream_prefix, loopback=loopback)
        if verdict is Verdict.ALLOW:
            return caller
        if verdict is Verdict.UNAUTHENTICATED:
            raise self._refuse(
                action,
                "unauthenticated",
                401,
                "UNAUTHENTICATED",
                f"{action.value} needs a credential (Authorization: Bearer <token>)",
            )
        if verdict is Verdict.PROTECTED_MODE:
            raise self._refuse(
                action,
                "protected-mode",
                403,
                "PROTECTED_MODE",
                "no credentials are configured, so members and producers are accepted only from "
                "loopback addresses; configure credentials (or start with --insecure)",
            )
        name = caller.name if caller is not None else "anonymous"
        where = f" on stream {stream_prefix!r}" if stream_prefix is not None else ""
        raise self._refuse(
            action, "forbidden", 403, "FORBIDDEN", f"credential {name!r} may not {_VERBS[action]}{where}"
        )

    def may_create(self, caller: Credential | None) -> bool:
        """Whether `caller` (as `check` returned it) may create streams and groups by heartbeat."""
        return auth.may_create(self.policy, caller)

    def _refuse(self, action: Action | None, reason: str, status: int, code: str, message: str) -> Refused:
        self.refusals.labels(action.value if action is not None else "other", reason).inc()
        return Refused(status, code, message)


#: What each action is, in a refusal's words.
_VERBS = {
    Action.MEMBER_HEARTBEAT: "send member heartbeats",
    Action.PRODUCER_HEARTBEAT: "send producer heartbeats",
    Action.ROUTING: "read the routing",
    Action.VIEW: "read the views",
    Action.METRICS: "read the metrics",
    Action.ADMIN: "use the Admin API",
}


def _from_loopback() -> bool:
    address = exchange.current().remote_addr
    if not address or address == UNIX_PEER:  # a Unix socket peer: on this host, like loopback
        return True
    if address.startswith("127.") or address == "::1":  # the usual spellings, without parsing
        return True
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return address.startswith("unix")


def basic_credentials(header: str) -> tuple[str | None, str | None]:
    """User and password from an HTTP Basic `Authorization` header value."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None, None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None, None
    return (user, password) if sep else (user, None)


def is_loopback_bind(bind: str) -> bool:
    """Whether `HOST:PORT` (or `[v6]:PORT`, `unix:path`) listens only on loopback."""
    if bind.startswith("unix:"):
        return True
    host = bind.rsplit(":", 1)[0] if ":" in bind else bind
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


ActionOf = Callable[[], tuple[Action, str | None] | None]

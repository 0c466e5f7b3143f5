"""The coordinator HTTP client (httpx on trio): retries with backoff and jitter, one error mapping.

Transport failures and 502/503/504 answers are retried with exponential
backoff and full jitter, up to `retries` more attempts; every other 4xx/5xx
is raised at once.

Several coordinators (an active one and standbys, see docs/operations.md)
are given as a list or one comma-separated string. The client stays on one
URL until a transport failure or a 503 (a standby answers 503 STANDBY),
then moves: to the active coordinator the standby named, if it is listed,
else to the next URL. Each call tries every URL at least once, and waits
(backoff) only before trying a URL again. Whatever goes wrong leaves here as `CoordinatorUnavailable`
or `CoordinatorRejected`. Redirects are followed (a coordinator that does
not own an aggregate may redirect to the one that does).
"""

from __future__ import annotations

import logging
import os
import random
import re
import ssl
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar

import attrs
import httpx
import trio

from rsc.client.errors import CoordinatorRejected, CoordinatorUnavailable, CoordinatorUnintelligible
from rsc.events import codec
from rsc.events.errors import http_status
from rsc.events.versions import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
from rsc.events.wire import (
    HeartbeatRequest,
    HeartbeatResponse,
    ProducerHeartbeatRequest,
    ProducerHeartbeatResponse,
)

log = logging.getLogger("rsc.client")
#: A coordinator's refusal of a protocol version it does not speak.
UNSUPPORTED_PROTOCOL = "UNSUPPORTED_PROTOCOL_VERSION"

T = TypeVar("T")
RETRYABLE = frozenset({502, 503, 504})
#: Where a client finds its credential and CA bundle when none is given.
TOKEN_ENV = "RSC_TOKEN"
CA_BUNDLE_ENV = "RSC_CA_BUNDLE"


def http_options(token: str | None, ca_bundle: str | None) -> dict[str, Any]:
    """httpx client options: `Authorization: Bearer` and the CA bundle for `https://` coordinators.

    Each falls back to its environment variable (`RSC_TOKEN`, `RSC_CA_BUNDLE`). Raises
    `CoordinatorUnavailable` naming the file and why when the CA bundle cannot be read or holds
    no certificate (no coordinator can be checked without it; not retried).
    """
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    ca_bundle = ca_bundle if ca_bundle is not None else os.environ.get(CA_BUNDLE_ENV) or None
    options: dict[str, Any] = {}
    if token:
        options["headers"] = {"Authorization": f"Bearer {token}"}
    if ca_bundle:
        try:
            options["verify"] = ca_context(ca_bundle)
        except OSError as exc:
            raise CoordinatorUnavailable(unusable_ca_bundle(ca_bundle, exc)) from exc
    return options


def ca_context(ca_bundle: str) -> ssl.SSLContext:
    """A TLS context that trusts the CAs of the PEM file `ca_bundle` (and no others).

    Raises `OSError`: `FileNotFoundError`, `PermissionError`... when the file cannot be read,
    `ssl.SSLError` when it holds no certificate (each client maps it to its own error)."""
    return ssl.create_default_context(cafile=ca_bundle)


def unusable_ca_bundle(ca_bundle: str, exc: OSError) -> str:
    """Why `ca_bundle` could not be loaded (`ca_context` raised `exc`), in words naming the file."""
    if isinstance(exc, ssl.SSLError):
        why = f"it holds no certificate ({exc.reason or exc})"
    else:
        why = exc.strerror or str(exc) or type(exc).__name__
    return f"cannot use the CA bundle {ca_bundle!r}: {why}"


@attrs.frozen
class Backoff:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2**n))."""

    base_s: float = 0.05
    cap_s: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.cap_s, self.base_s * 2**attempt))


def coordinator_urls(base_url: str | Sequence[str]) -> tuple[str, ...]:
    """Every coordinator URL: a list, or one string with commas between URLs (trailing `/` dropped).

    Raises `ValueError` when there is none, or naming the URL and what is wrong with it when one
    is not an `http://` or `https://` URL with a host (`check_url`)."""
    parts = base_url.split(",") if isinstance(base_url, str) else list(base_url)
    urls = tuple(part.strip().rstrip("/") for part in parts if part.strip())
    if not urls:
        raise ValueError("no coordinator URL given")
    for url in urls:
        check_url(url)
    return urls


def check_url(url: str) -> None:
    """Refuse a coordinator URL that no request could use: malformed, without `http://` or
    `https://`, without a host, or with a port out of range.

    Raises `ValueError` naming the URL (its password hidden) and what is wrong."""
    shown = _USERINFO.sub(r"\1:***@", url)
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"the coordinator URL {shown!r} is malformed: {exc}") from exc
    if parsed.scheme not in ("http", "https"):
        what = f"the scheme {parsed.scheme!r}" if "://" in url else "no scheme"
        raise ValueError(f"the coordinator URL {shown!r} has {what}: it must start with http:// or https://")
    if not parsed.host:
        raise ValueError(f"the coordinator URL {shown!r} names no host")
    if parsed.port is not None and not 0 < parsed.port < 65_536:
        raise ValueError(f"the coordinator URL {shown!r} has a port out of range: {parsed.port}")


#: The user and password of a URL (hidden from messages).
_USERINFO = re.compile(r"(?<=://)([^/?#@]*?):[^/?#]*@")


class Failover:
    """The coordinator URLs a client knows and the one it uses now (shared by all its calls).

    Raises `ValueError` (constructing) when no URL is given or one is unusable (`check_url`)."""

    def __init__(self, base_url: str | Sequence[str]) -> None:
        self.urls = coordinator_urls(base_url)
        self.current = 0

    @property
    def url(self) -> str:
        return self.urls[self.current]

    def attempts(self, retries: int, backoff: Backoff, rng: random.Random) -> Iterator[tuple[float, int]]:
        """For each attempt of one call: seconds to wait first, and which URL (index) to use.

        At least one attempt per URL; the wait is 0 for a URL not yet tried in this call.
        """
        tried: set[int] = set()
        waits = 0
        for _ in range(max(retries + 1, len(self.urls))):
            index = self.current
            wait = 0.0
            if index in tried:
                wait = backoff.delay(waits, rng)
                waits += 1
            tried.add(index)
            yield wait, index

    def failed(self, index: int, rejection: CoordinatorRejected | None = None) -> None:
        """The URL at `index` failed (transport error or 503): move on, unless another call already did."""
        if index != self.current or len(self.urls) == 1:
            return
        details = rejection.details if rejection is not None else None
        active = details.get("active") if isinstance(details, dict) else None
        named = active.rstrip("/") if isinstance(active, str) else None
        if named in self.urls and named != self.urls[index]:
            self.current = self.urls.index(named)
        else:
            self.current = (index + 1) % len(self.urls)


class Negotiation:
    """The protocol version a client speaks to its coordinators: the newest it knows, stepped
    down one version at a time when a coordinator refuses it (an older release refuses a
    newer version with `UNSUPPORTED_PROTOCOL_VERSION`), and down to what a newer coordinator
    answers in. Once stepped down, the newest is tried again after `retry_newest_s` (the
    coordinators may have been upgraded meanwhile)."""

    def __init__(self, retry_newest_s: float = 300.0) -> None:
        self.version = PROTOCOL_VERSION
        self.retry_newest_s = retry_newest_s
        self._stepped_down_at: float | None = None

    def stamp(self, body: Any) -> Any:
        """`body` with the version to speak now (bodies without `protocolVersion` as they are)."""
        if not isinstance(body, dict) or "protocolVersion" not in body:
            return body
        if (
            self._stepped_down_at is not None
            and time.monotonic() - self._stepped_down_at >= self.retry_newest_s
        ):
            self.version, self._stepped_down_at = PROTOCOL_VERSION, None
        requested = body["protocolVersion"]
        if isinstance(requested, int) and requested > self.version:
            return body | {"protocolVersion": self.version}
        return body

    def refused(self, code: str, sent: Any) -> bool:
        """Whether a refusal with `code` of `sent` means: speak an older version, try again."""
        version = sent.get("protocolVersion") if isinstance(sent, dict) else None
        if code != UNSUPPORTED_PROTOCOL or not isinstance(version, int):
            return False
        if version > self.version:
            return True  # a request sent before another one stepped down: send it again
        if version != self.version or version <= MIN_PROTOCOL_VERSION:
            return False
        self.version -= 1
        self._stepped_down_at = time.monotonic()
        log.info("the coordinator does not speak this protocol version: stepping down to %d", self.version)
        return True

    def answered(self, data: Any) -> None:
        """An answer names the version it is in (from version 2 on): speak no newer one."""
        version = data.get("protocolVersion") if isinstance(data, dict) else None
        if isinstance(version, int) and MIN_PROTOCOL_VERSION <= version < self.version:
            self.version = version
            self._stepped_down_at = time.monotonic()


class Coordinator:
    """Talks to the coordinator (one base URL, or several: see the module docstring).

    Use as an async context manager or call `aclose`.

    `token` is the bearer credential sent with every request and `ca_bundle` the CA
    file that checks an `https://` coordinator (defaults: `RSC_TOKEN`, `RSC_CA_BUNDLE`).

    Constructing raises `ValueError` when no URL is given or one is unusable (malformed, not
    `http://` or `https://`, no host: see `check_url`), and `CoordinatorUnavailable` when the
    CA bundle cannot be read (each naming the URL or file and what is wrong); otherwise the
    calls raise only `rsc.client.errors`.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff: Backoff = Backoff(),
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
        token: str | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        self.retries = retries
        self.timeout_s = timeout_s
        self.backoff = backoff
        self.rng = rng or random.Random()
        self.failover = Failover(base_url)
        self.negotiation = Negotiation()
        self.http = httpx.AsyncClient(
            base_url=self.failover.urls[0],
            timeout=timeout_s,
            follow_redirects=True,
            transport=transport,
            **http_options(token, ca_bundle),
        )

    async def __aenter__(self) -> Coordinator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    # --- the protocol ---------------------------------------------------

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        """One member's heartbeat (`POST /v1/heartbeat`); a long poll (`wait_ms`) may be held.

        Raises `CoordinatorUnavailable` when no coordinator answered (transport error, timeout,
        502/503/504) in `retries` more attempts, every URL tried at least once;
        `CoordinatorUnintelligible` at once for a 2xx answer that is not a `HeartbeatResponse`;
        `CoordinatorRejected` at once for any other 4xx/5xx (a refused protocol version is first
        stepped down and sent again)."""
        body = codec.wire.unstructure(request)
        data = await self._send("POST", "/v1/heartbeat", body, request.wait_ms / 1000)
        return structure(data, HeartbeatResponse)

    async def heartbeats(
        self, requests: Sequence[HeartbeatRequest]
    ) -> list[HeartbeatResponse | CoordinatorRejected]:
        """The heartbeats of one process's members in one request; a refused item gives its error.

        A refused item is returned as a `CoordinatorRejected` (status 400), not raised. The whole
        request raises as `heartbeat` does; `CoordinatorUnintelligible` also when the answer has
        not one response per heartbeat or an item is not a `HeartbeatResponse`."""
        while True:
            body = {"heartbeats": [self.negotiation.stamp(codec.wire.unstructure(r)) for r in requests]}
            data = await self._send("POST", "/v1/heartbeats", body, stamp=False)
            items = data.get("responses") if isinstance(data, dict) else None
            if not isinstance(items, list) or len(items) != len(requests):
                raise CoordinatorUnintelligible(
                    "POST /v1/heartbeats: the answer has no response per heartbeat"
                )
            refused = [
                sent
                for sent, item in zip(body["heartbeats"], items, strict=True)
                if isinstance(item, dict) and item.get("error") == UNSUPPORTED_PROTOCOL
            ]
            if not (refused and self.negotiation.refused(UNSUPPORTED_PROTOCOL, refused[0])):
                break
        for item in items:
            self.negotiation.answered(item)
        out: list[HeartbeatResponse | CoordinatorRejected] = []
        for item in items:
            if isinstance(item, dict) and "error" in item:
                out.append(
                    CoordinatorRejected(
                        _item_status(item),
                        item["error"],
                        item.get("message", ""),
                        item.get("requestId", ""),
                        item.get("details"),
                    )
                )
            else:
                out.append(structure(item, HeartbeatResponse))
        return out

    async def producer_heartbeat(self, request: ProducerHeartbeatRequest) -> ProducerHeartbeatResponse:
        """One producer heartbeat (`POST /v1/producers/heartbeat`).

        Raises `CoordinatorUnavailable` when no coordinator answered (transport error, timeout,
        502/503/504) in `retries` more attempts, every URL tried at least once;
        `CoordinatorUnintelligible` at once for a 2xx answer that is not a
        `ProducerHeartbeatResponse`; `CoordinatorRejected` at once for any other 4xx/5xx."""
        data = await self._post("/v1/producers/heartbeat", codec.wire.unstructure(request))
        return structure(data, ProducerHeartbeatResponse)

    async def routing(self, stream_prefix: str) -> dict[str, Any]:
        """Routing metadata without registering (`GET /v1/streams/{p}/routing`).

        Raises `CoordinatorUnavailable` when no coordinator answered (transport error, timeout,
        502/503/504) in `retries` more attempts, every URL tried at least once;
        `CoordinatorUnintelligible` at once for a 2xx answer that is not JSON (its shape is not
        checked); `CoordinatorRejected` at once for any other 4xx/5xx (404 `UNKNOWN_STREAM`...)."""
        data: dict[str, Any] = await self._send("GET", f"/v1/streams/{stream_prefix}/routing", None)
        return data

    # --- transport ------------------------------------------------------

    async def _post(self, path: str, body: Any) -> Any:
        return await self._send("POST", path, body)

    @property
    def base_url(self) -> str:
        """The coordinator URL in use now."""
        return self.failover.url

    async def _send(
        self, method: str, path: str, body: Any, held_s: float = 0.0, *, stamp: bool = True
    ) -> Any:
        """`held_s`: how long the coordinator may hold the answer (a long poll), on top of the
        timeout. The body speaks the negotiated protocol version (unless `stamp` is false: the
        caller did it), stepping down when a coordinator refuses it."""
        last: Exception | None = None
        timeout = httpx.Timeout(self.timeout_s + held_s) if held_s else httpx.USE_CLIENT_DEFAULT
        for wait, index in self.failover.attempts(self.retries, self.backoff, self.rng):
            if wait:
                await trio.sleep(wait)
            while True:
                try:
                    url = self.failover.urls[index] + path
                    sent = self.negotiation.stamp(body) if stamp else body
                    response = await self.http.request(method, url, json=sent, timeout=timeout)
                except httpx.HTTPError as exc:  # connect, read, timeouts, protocol errors
                    last = exc
                    self.failover.failed(index)
                    break
                try:
                    data = settle(method, path, response, sent if stamp else None, self, index)
                except Retry as retry:
                    last = retry.rejection
                    break
                if data is not AGAIN:
                    return data
        raise CoordinatorUnavailable(f"{method} {path}: {describe(last)}") from last


#: `settle`'s answer when the request is to go to the same coordinator again, stepped down.
AGAIN: Any = object()


class Negotiating(Protocol):
    failover: Failover
    negotiation: Negotiation


def settle(
    method: str, path: str, response: httpx.Response, sent: Any, client: Negotiating, index: int
) -> Any:
    """An answer's JSON (the negotiation noting its version), or `AGAIN` when the coordinator
    refused the protocol version of `sent` (None: not negotiated) and the client stepped down.
    Raises `Retry` (a 503 moves the failover on), `CoordinatorRejected`, or
    `CoordinatorUnintelligible` for a successful answer that is not JSON."""
    try:
        data = answer(method, path, response)
    except CoordinatorRejected as rejected:
        if sent is not None and client.negotiation.refused(rejected.code, sent):
            return AGAIN
        raise
    except Retry as retry:
        if retry.rejection.status == 503:
            client.failover.failed(index, retry.rejection)
        raise
    client.negotiation.answered(data)
    return data


class Retry(Exception):
    """A 502/503/504: worth another attempt."""

    def __init__(self, rejection: CoordinatorRejected) -> None:
        super().__init__(str(rejection))
        self.rejection = rejection


def describe(error: BaseException | None) -> str:
    """An error in words, never empty: httpx's connect errors on trio often say nothing
    themselves (`ConnectError(BrokenResourceError())`) while their cause, such as a failed
    certificate check, says what went wrong; the deepest cause with a message is added."""
    if error is None:
        return "no answer"
    text = f"{type(error).__name__}: {error}" if str(error) else repr(error)
    cause, seen = error.__cause__ or error.__context__, 0
    deepest = None
    while cause is not None and seen < 8:
        if str(cause):
            deepest = cause
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return f"{text} ({type(deepest).__name__}: {deepest})" if deepest is not None else text


def answer(method: str, path: str, response: httpx.Response) -> Any:
    """The JSON of a successful answer; raise `Retry` or `CoordinatorRejected` for the others.

    Raises `CoordinatorUnintelligible` when a successful answer is not JSON."""
    if response.status_code in RETRYABLE:
        raise Retry(_rejection(response))
    if response.status_code >= 400:
        raise _rejection(response)
    try:
        return response.json()
    except ValueError as exc:
        raise CoordinatorUnintelligible(f"{method} {path}: the answer is not JSON") from exc


def _item_status(item: dict[str, Any]) -> int:
    """The status of a refused item of a batch: what it names (this coordinator), else what its
    error code is answered with alone (an older one sent none: every item was taken for a 400)."""
    status = item.get("status")
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
        return status
    return http_status(str(item["error"]))


def _rejection(response: httpx.Response) -> CoordinatorRejected:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return CoordinatorRejected(
        response.status_code,
        str(body.get("error", "HTTP_ERROR")),
        str(body.get("message", response.reason_phrase)),
        str(body.get("requestId", response.headers.get("X-Request-Id", ""))),
        body.get("details"),
    )


def structure(data: Any, as_type: type[T]) -> T:
    """`data` (an answer's JSON) as `as_type`.

    Raises `CoordinatorUnintelligible` when it does not match (a field missing or of the wrong type)."""
    try:
        return codec.converter.structure(data, as_type)
    except Exception as exc:
        raise CoordinatorUnintelligible(
            f"the coordinator's answer does not match {as_type.__name__}: {exc}"
        ) from exc

"""The one typed client of the Admin API and the monitoring views (synchronous, httpx).

The `rsc` admin commands, `rsc apply` and the Terraform provider all go through it, so the
API has one client-side copy. Credentials: HTTP Basic from the arguments, else the
environment (`RSC_ADMIN_USER`, default `admin`, and `RSC_ADMIN_PASSWORD`), else a
netrc-style file (`RSC_NETRC`, default `~/.netrc`) entry for the coordinator's host. The
coordinator URL: the argument, else `RSC_COORDINATOR_URL`, else `http://127.0.0.1:8080`.

Every answer keeps its `X-Request-Id` (`Answer.request_id`), so a mutating command can show
it and find its audit record. Errors leave as `AdminError` with the coordinator's code.
"""

from __future__ import annotations

import netrc
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import attrs
import httpx

from rsc.client.coordinator import CA_BUNDLE_ENV, ca_context, unusable_ca_bundle

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "RSC_COORDINATOR_URL"
USER_ENV = "RSC_ADMIN_USER"
PASSWORD_ENV = "RSC_ADMIN_PASSWORD"
NETRC_ENV = "RSC_NETRC"


#: Items asked per page when a list is read whole.
PAGE_SIZE = 1_000


class AdminError(Exception):
    """The coordinator refused or failed a request (`status` 0: it could not be reached, or the
    client could not be set up; a 2xx `status` with `NOT_JSON`: its answer could not be read)."""

    def __init__(
        self, status: int, code: str, message: str, request_id: str = "", details: Any = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details = details


@attrs.frozen
class Answer:
    """A successful answer: its JSON body (None for 204), `ETag` and request id."""

    body: Any
    etag: str | None
    request_id: str
    status: int

    @property
    def revision(self) -> int | None:
        """The `ETag` as a revision number (None without one); `ValueError` for a non-numeric one."""
        return int(self.etag.strip('"')) if self.etag else None


def credentials(
    url: str, user: str | None = None, password: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """(user, password) for `url`: the arguments, the environment, then a netrc-style file.

    Raises `AdminError` (status 0, `BAD_NETRC`) when the file cannot be parsed, or exists but
    cannot be read (a missing file is no error)."""
    environ = os.environ if environ is None else environ
    user = user or environ.get(USER_ENV) or None
    password = password if password is not None else environ.get(PASSWORD_ENV) or None
    if password is not None:
        return (user or "admin", password)
    path = Path(environ.get(NETRC_ENV) or Path.home() / ".netrc")
    host = urlsplit(url).hostname or ""
    try:
        found = netrc.netrc(str(path)).authenticators(host)
    except FileNotFoundError:
        return None
    except (netrc.NetrcParseError, OSError) as exc:  # a broken or unreadable file is said, not skipped
        raise AdminError(0, "BAD_NETRC", f"cannot read credentials from {path}: {exc}") from exc
    if found is None or found[2] is None:
        return None
    return (user or found[0] or "admin", found[2])


class AdminClient:
    """The Admin API and the views of one coordinator.

    Constructing raises `AdminError` (status 0): `BAD_URL` for a URL that is not http(s),
    `BAD_NETRC` (see `credentials`), `BAD_CA_BUNDLE` for a CA bundle it cannot read (naming
    the file and why)."""

    def __init__(
        self,
        url: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout_s: float = 10.0,
        ca_bundle: str | None = None,
    ) -> None:
        self.url = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise AdminError(
                0, "BAD_URL", f"the coordinator URL must start with http:// or https://, not {self.url!r}"
            )
        auth = credentials(self.url, user, password)
        #: Whether requests carry credentials (a 401 without them: say where to set them).
        self.sends_credentials = auth is not None
        ca_bundle = ca_bundle or os.environ.get(CA_BUNDLE_ENV) or None
        verify: Any = True
        if ca_bundle:
            try:
                verify = ca_context(ca_bundle)
            except OSError as exc:
                raise AdminError(0, "BAD_CA_BUNDLE", unusable_ca_bundle(ca_bundle, exc)) from exc
        self.http = httpx.Client(base_url=self.url, auth=auth, timeout=timeout_s, verify=verify)

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # --- transport ---------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        if_match: int | str | None = None,
        create_only: bool = False,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> Answer:
        """`create_only`: `If-None-Match: *` (412 if the resource exists or is created meanwhile).

        Raises `AdminError`: status 0 `UNREACHABLE` when no answer came (connection, timeout), else
        the coordinator's status and code for any 4xx/5xx (429 `RATE_LIMITED` only after 20 tries,
        each after the wait it names), and the 2xx status with `NOT_JSON` for a successful answer
        that is not JSON (not a coordinator, or not its API)."""
        headers = {}
        if if_match is not None:
            headers["If-Match"] = if_match if isinstance(if_match, str) else f'"{if_match}"'
        if create_only:
            headers["If-None-Match"] = "*"
        if body is not None:
            headers["Content-Type"] = content_type
        for attempt in range(RATE_LIMITED_ATTEMPTS):
            try:
                response = self.http.request(
                    method,
                    path,
                    json=body,
                    headers=headers,
                    params={k: v for k, v in (params or {}).items() if v is not None},
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s,
                )
            except httpx.HTTPError as exc:
                raise AdminError(0, "UNREACHABLE", f"no answer from {self.url}: {exc}") from exc
            wait = _rate_limited(response)
            if wait is None or attempt == RATE_LIMITED_ATTEMPTS - 1:
                break
            time.sleep(wait)  # a long `rsc apply` goes on at the rate the coordinator allows
        request_id = response.headers.get("X-Request-Id", "")
        if response.status_code >= 400:
            try:
                error = response.json()
                code, message, details = error["error"], error["message"], error.get("details")
            except (ValueError, KeyError, TypeError):
                code, message, details = "HTTP_ERROR", response.text[:200], None
            if isinstance(details, list) and all(isinstance(d, str) for d in details):
                message = f"{message}: {'; '.join(details)}"  # what exactly is wrong
            if code == "NOT_FOUND" and not self._is_coordinator():  # a wrong base URL, not a resource
                message = f"no such path on {self.url}: is it the coordinator's base URL (without /v1)?"
            raise AdminError(response.status_code, code, message, request_id, details)
        try:
            content = response.json() if response.content else None
        except ValueError as exc:
            kind = response.headers.get("Content-Type", "no content type")
            raise AdminError(
                response.status_code,
                "NOT_JSON",
                f"the answer to {method} {path} from {self.url} is not JSON ({kind}): "
                "is it the coordinator's base URL (without /v1)?",
                request_id,
            ) from exc
        return Answer(content, response.headers.get("ETag"), request_id, response.status_code)

    def _is_coordinator(self) -> bool:
        """The base URL is an rsc coordinator's: `GET /v1/version` names its server version
        (asked only to explain a 404; what failed is said either way)."""
        try:
            answer = self.http.get("/v1/version")
            return answer.status_code == 200 and "serverVersion" in answer.json()
        except (httpx.HTTPError, ValueError, TypeError):
            return False

    # --- streams -------------------------------------------------------------

    def streams(self) -> list[dict[str, Any]]:
        """Every stream with its version, shard count and groups, page by page (`PAGE_SIZE` a
        request; an N-1 coordinator, which knows no pages, answers the whole list at once).
        Raises `AdminError` as `request` does."""
        streams: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": PAGE_SIZE}
        while True:
            body = self.request("GET", "/v1/streams", params=params).body
            streams += body["streams"]
            cursor = body.get("nextCursor")
            if not cursor:
                return streams
            params = {"limit": PAGE_SIZE, "cursor": cursor}

    def stream(self, prefix: str) -> Answer:
        """`{spec, status, revision}` of a stream. Raises `AdminError` as `request` does (404 if none)."""
        return self.request("GET", f"/v1/admin/streams/{_seg(prefix)}")

    def stream_view(self, prefix: str) -> dict[str, Any]:
        """The monitoring view: shards with Redis figures and drain evidence, producers, migration.

        Raises `AdminError` as `request` does (404 if there is no such stream)."""
        view: dict[str, Any] = self.request("GET", f"/v1/streams/{_seg(prefix)}").body
        return view

    def put_stream(
        self,
        prefix: str,
        spec: Mapping[str, Any],
        if_match: int | str | None = None,
        create_only: bool = False,
    ) -> Answer:
        """Create or replace a stream's spec. Raises `AdminError` as `request` does
        (412 `PRECONDITION_FAILED` when `if_match` is not its revision, or `create_only` and it exists)."""
        path = f"/v1/admin/streams/{_seg(prefix)}"
        return self.request("PUT", path, dict(spec), if_match=if_match, create_only=create_only)

    def patch_stream(
        self, prefix: str, patch: Mapping[str, Any], if_match: int | str | None = None
    ) -> Answer:
        """Merge-patch a stream's spec.

        Raises `AdminError` as `request` does (404, or 412 for a stale `if_match`)."""
        return self._patch(f"/v1/admin/streams/{_seg(prefix)}", patch, if_match)

    def delete_stream(self, prefix: str, if_match: int | str | None = None) -> Answer:
        """Delete a stream. Raises `AdminError` as `request` does (404, or 412 for a stale `if_match`)."""
        return self.request("DELETE", f"/v1/admin/streams/{_seg(prefix)}", if_match=if_match)

    def pause(self, prefix: str, reason: str | None = None) -> Answer:
        """Pause the stream's producers. Raises `AdminError` as `request` does."""
        body = {"reason": reason} if reason else None
        return self.request("POST", f"/v1/admin/streams/{_seg(prefix)}/pause", body)

    def resume(self, prefix: str) -> Answer:
        """Resume a paused stream. Raises `AdminError` as `request` does."""
        return self.request("POST", f"/v1/admin/streams/{_seg(prefix)}/resume")

    def migration(self, prefix: str, action: str, reason: str | None = None) -> Answer:
        """`action`: `resume` (a stalled migration) or `abort`. Raises `AdminError` as `request` does."""
        body = {"reason": reason} if reason and action == "abort" else None
        return self.request("POST", f"/v1/admin/streams/{_seg(prefix)}/migration/{action}", body)

    # --- groups --------------------------------------------------------------

    def group(self, prefix: str, group: str) -> Answer:
        """`{spec, status, revision}` of a group. Raises `AdminError` as `request` does (404 if none)."""
        return self.request("GET", f"/v1/admin/streams/{_seg(prefix)}/groups/{_seg(group)}")

    def group_view(self, prefix: str, group: str) -> dict[str, Any]:
        """The monitoring view of a group. Raises `AdminError` as `request` does (404 if none)."""
        view: dict[str, Any] = self.request("GET", f"/v1/streams/{_seg(prefix)}/groups/{_seg(group)}").body
        return view

    def put_group(
        self,
        prefix: str,
        group: str,
        spec: Mapping[str, Any],
        if_match: int | str | None = None,
        create_only: bool = False,
    ) -> Answer:
        """Create or replace a group's spec. Raises `AdminError` as `request` does
        (404 for an unknown stream; 412 as for `put_stream`)."""
        path = f"/v1/admin/streams/{_seg(prefix)}/groups/{_seg(group)}"
        return self.request("PUT", path, dict(spec), if_match=if_match, create_only=create_only)

    def patch_group(
        self, prefix: str, group: str, patch: Mapping[str, Any], if_match: int | str | None = None
    ) -> Answer:
        """Merge-patch a group's spec.

        Raises `AdminError` as `request` does (404, or 412 for a stale `if_match`)."""
        return self._patch(f"/v1/admin/streams/{_seg(prefix)}/groups/{_seg(group)}", patch, if_match)

    def delete_group(self, prefix: str, group: str, if_match: int | str | None = None) -> Answer:
        """Delete a group. Raises `AdminError` as `request` does (404, or 412 for a stale `if_match`)."""
        path = f"/v1/admin/streams/{_seg(prefix)}/groups/{_seg(group)}"
        return self.request("DELETE", path, if_match=if_match)

    def pause_group(self, prefix: str, group: str, reason: str | None = None) -> Answer:
        """Pause a group (feature level 7): its members hold no shard until `resume_group`.
        Raises `AdminError` as `request` does (404, 409 `FEATURE_LEVEL_REQUIRED`)."""
        body = {"reason": reason} if reason else None
        return self.request("POST", f"/v1/admin/streams/{_seg(prefix)}/groups/{_seg(group)}/pause", body)

    def resume_group(self, prefix: str, group: str) -> Answer:
        """Resume a paused group. Raises `AdminError` as `request` does."""
        return self.request("POST", f"/v1/admin/streams/{_seg(prefix)}/groups/{_seg(group)}/resume")

    def reset_group(
        self, prefix: str, group: str, to: Any, execute: bool = False, force: bool = False
    ) -> Answer:
        """A reset of a group's position (`to`: "earliest", "latest", {"timeMs": T} or
        {"ids": {...}}): its plan, or (`execute`) the reset. Raises `AdminError` as `request`
        does (409 `NOT_EMPTY` with members unless `force`)."""
        body = {"to": to, "dryRun": not execute, "force": force}
        path = f"/v1/admin/streams/{_seg(prefix)}/groups/{_seg(group)}/reset"
        # a forced reset waits for every member to hand its shards back (the revoke timeout at most)
        return self.request("POST", path, body, timeout_s=180.0 if execute else None)

    def remove_member(self, prefix: str, group: str, member_id: str) -> Answer:
        """Fence a live member (`REMOVED`), or end a static member's hold.

        Raises `AdminError` as `request` does."""
        path = f"/v1/admin/streams/{_seg(prefix)}/groups/{_seg(group)}/members/{quote(member_id, safe='/')}"
        return self.request("DELETE", path)

    # --- dead letters --------------------------------------------------------

    def dead_letters(self, prefix: str) -> dict[str, Any]:
        """Per shard the dead-letter stream's key and length. Raises `AdminError` as `request` does."""
        body: dict[str, Any] = self.request("GET", f"/v1/admin/streams/{_seg(prefix)}/dlq").body
        return body

    def dead_letter_entries(self, prefix: str, shard: int | None = None, limit: int = 100) -> dict[str, Any]:
        """Dead letters of the stream (of one shard), at most `limit`.

        Raises `AdminError` as `request` does."""
        params = {"shard": shard, "limit": limit}
        body: dict[str, Any] = self.request(
            "GET", f"/v1/admin/streams/{_seg(prefix)}/dlq/entries", params=params
        ).body
        return body

    def replay_dead_letters(
        self, prefix: str, shard: int | None = None, ids: list[str] | None = None, limit: int = 100
    ) -> Answer:
        """Replay dead letters (`ids`, or up to `limit`; of one shard).

        Raises `AdminError` as `request` does."""
        body: dict[str, Any] = {"limit": limit}
        if shard is not None:
            body["shard"] = shard
        if ids:
            body["ids"] = ids
        return self.request("POST", f"/v1/admin/streams/{_seg(prefix)}/dlq/replay", body)

    # --- audit and features ----------------------------------------------------

    def audit(self, **filters: Any) -> list[dict[str, Any]]:
        """Audit records matching `filters` (query parameters), newest first: `limit` of them
        (default 100), more than a page holds read page by page (an N-1 coordinator, which gives
        no cursor, answers one page). Raises `AdminError` as `request` does."""
        wanted = int(filters.pop("limit", 100))
        records: list[dict[str, Any]] = []
        params = dict(filters)
        while len(records) < wanted:
            params["limit"] = min(PAGE_SIZE, wanted - len(records))
            body = self.request("GET", "/v1/admin/audit", params=params).body
            records += body["records"]
            cursor = body.get("nextCursor")
            if not cursor:
                break
            params["cursor"] = cursor
        return records[:wanted]

    def features(self) -> dict[str, Any]:
        """The deployment's feature level (`GET /v1/admin/features`).

        Raises `AdminError` as `request` does."""
        body: dict[str, Any] = self.request("GET", "/v1/admin/features").body
        return body

    def _patch(self, path: str, patch: Mapping[str, Any], if_match: int | str | None) -> Answer:
        return self.request(
            "PATCH", path, dict(patch), if_match=if_match, content_type="application/merge-patch+json"
        )


def _seg(name: str) -> str:
    """A path segment (names are checked by the server; this only keeps the URL well formed)."""
    return quote(name, safe="")


#: How often a request answered 429 RATE_LIMITED is sent again (after the wait it was told).
RATE_LIMITED_ATTEMPTS = 20


def _rate_limited(response: httpx.Response) -> float | None:
    """The wait a 429 RATE_LIMITED answer asks for (None for any other answer)."""
    if response.status_code != 429:
        return None
    try:
        error = response.json()
        if error.get("error") != "RATE_LIMITED":
            return None
        return min(5.0, max(0.01, float(error["details"]["retryAfterS"])))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None

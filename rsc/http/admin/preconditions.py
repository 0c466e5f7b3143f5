"""Conditional requests of the Admin API (RFC 9110 13.1): `ETag`, `If-Match`, `If-None-Match`.

A resource's entity tag is its aggregate's journal revision (`"3"`). `If-Match` names the
revisions a write may find (strong comparison: a weak tag never matches); the revision is
checked here and again by the actor, atomically with the write (`PreconditionFailed`).
`If-None-Match: *` makes a `PUT` create only. A malformed precondition is a 400, never a
write without one.
"""

from __future__ import annotations

import re
from typing import Any

from quart import Response, request

from rsc.http.errors import ApiError

#: An entity tag (RFC 9110 8.8.3): optionally weak, quoted, no quote or control inside.
_ETAG = re.compile(r'(W/)?"([\x21\x23-\x7e]*)"')


def with_etag(response: Response, revision: int) -> Response:
    """`response` with the `ETag` of `revision`."""
    response.headers["ETag"] = f'"{revision}"'
    return response


def precondition(name: str) -> tuple[bool, list[tuple[bool, str]]] | None:
    """The `If-Match` / `If-None-Match` header (every line of it, as one list, RFC 9110 5.3):
    None if absent, else (`*`, [(weak, tag), ...]).

    Raises `ApiError` (400 `INVALID_REQUEST`) for anything else, so that a mistyped
    precondition is never silently a write without one."""
    lines = request.headers.getlist(name)
    if not lines:
        return None
    items = [item.strip() for line in lines for item in line.split(",")]
    items = [item for item in items if item]
    if not items:
        raise ApiError(400, "INVALID_REQUEST", f'{name} is empty: give * or entity tags such as "3"')
    if items == ["*"]:
        return True, []
    tags = []
    for item in items:
        found = _ETAG.fullmatch(item)
        if found is None:
            raise ApiError(
                400,
                "INVALID_REQUEST",
                f'{name} must be * or entity tags such as "3" (the ETag of a read), not {item[:40]!r}',
            )
        tags.append((found.group(1) is not None, found.group(2)))
    return False, tags


def check_if_none_match(actor: Any, what: str) -> bool:
    """`If-None-Match`: `*` refuses a resource that exists, and the create that follows is
    refused too if another one creates it first (True: create only); a list of entity tags
    (weak comparison) refuses a resource at one of them. `actor`: the resource's (None: none).

    Raises `ApiError` (412 `PRECONDITION_FAILED`; 400 for a malformed header)."""
    wanted = precondition("If-None-Match")
    if wanted is None:
        return False
    every, tags = wanted
    if every:
        if actor is not None:
            raise ApiError(412, "PRECONDITION_FAILED", f"{what} exists (If-None-Match: *)")
        return True
    if actor is not None and str(actor.revision) in {tag for _, tag in tags}:
        raise ApiError(412, "PRECONDITION_FAILED", f"{what} is at revision {actor.revision} (If-None-Match)")
    return False


def check_if_match(revision: int) -> int | None:
    """The revision the write must still find when the actor decides it (checked there again,
    atomically), or None without `If-Match` (or with `*`).

    Raises `ApiError` (412 `PRECONDITION_FAILED`) if `If-Match` names other revisions than
    `revision`; 400 for a malformed header."""
    wanted = precondition("If-Match")
    if wanted is None or wanted[0]:
        return None
    strong = {tag for weak, tag in wanted[1] if not weak}
    if str(revision) not in strong:
        shown = ", ".join(("W/" if weak else "") + f'"{tag}"' for weak, tag in wanted[1])
        raise ApiError(412, "PRECONDITION_FAILED", f"the resource is at revision {revision}, not {shown}")
    return revision


def missing_with_if_match(what: str) -> None:
    """A resource that does not exist fails any `If-Match` (RFC 9110 13.1.1): 412, not 404.

    Raises `ApiError` (412 `PRECONDITION_FAILED`) if the request has one; 400 for a malformed
    header."""
    if precondition("If-Match") is not None:
        raise ApiError(412, "PRECONDITION_FAILED", f"there is no {what} (If-Match)")

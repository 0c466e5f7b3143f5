"""Pages of a list: `limit` and `cursor` in the query, `nextCursor` and a `Link` header back.

Keyset pagination: a list is sorted by a key that never changes for an item (a stream's
prefix, a member's id, an audit record's id), and a cursor says "after this key". So a walk
page by page sees each item that existed for the whole walk exactly once, whatever is created
or deleted meanwhile (an item created behind the cursor is not seen by this walk; one deleted
ahead of it is not listed), and a page costs what it holds, not what came before it.

The cursor is opaque to callers (base64url of a small JSON object naming the list it belongs
to): one that does not decode, or that belongs to another list, is a 400 `INVALID_CURSOR`.
Without `limit` an answer is the whole list, as before pages existed (an N-1 tool such as
`rsc apply --prune` never mistakes a page for everything), and without `nextCursor`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar
from urllib.parse import urlencode

import attrs
from quart import Response, request

from rsc.http.errors import ApiError

T = TypeVar("T")

#: The most items one page may hold.
MAX_LIMIT = 1_000


@attrs.frozen
class PageRequest:
    """What the query asked: at most `limit` items (None: all of them) after the key `after`."""

    limit: int | None
    after: str | None


@attrs.frozen
class Page(Generic[T]):
    items: tuple[T, ...]
    #: The cursor of the next page; None when this page ends the list.
    next_cursor: str | None


def page_request(kind: str, *, default_limit: int | None = None) -> PageRequest:
    """The `limit` and `cursor` of this request's query, for the list named `kind`.

    `default_limit`: the page size when `limit` is not given (None: the whole list). Raises
    `ApiError` 400: `INVALID_REQUEST` for a `limit` that is not 1..MAX_LIMIT, `INVALID_CURSOR`
    for a cursor that is not one of this list's."""
    raw_limit = request.args.getlist("limit")
    raw_cursor = request.args.getlist("cursor")
    if len(raw_limit) > 1 or len(raw_cursor) > 1:
        raise ApiError(400, "INVALID_REQUEST", "limit and cursor may each be given once")
    limit = default_limit
    if raw_limit:
        try:
            limit = int(raw_limit[0])
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            raise ApiError(
                400,
                "INVALID_REQUEST",
                f"limit must be an integer from 1 to {MAX_LIMIT}",
                {"limit": raw_limit[0], "max": MAX_LIMIT},
            )
    after = decode_cursor(kind, raw_cursor[0]) if raw_cursor else None
    return PageRequest(limit, after)


def encode_cursor(kind: str, after: str) -> str:
    """The opaque cursor of the page after key `after` of list `kind`."""
    data = json.dumps({"list": kind, "after": after}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def decode_cursor(kind: str, cursor: str) -> str:
    """The key a cursor of list `kind` points after. Raises `ApiError` 400 `INVALID_CURSOR`."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict) or data.get("list") != kind or not isinstance(data.get("after"), str):
        raise ApiError(
            400,
            "INVALID_CURSOR",
            f"cursor is not one this server gave for {kind}: pass nextCursor of the previous page "
            "as it is, or leave it out to start from the beginning",
        )
    after: str = data["after"]
    return after


def take_page(kind: str, keys: Sequence[str], wanted: PageRequest) -> Page[str]:
    """The page of sorted, distinct `keys` that `wanted` asks for."""
    return page_of(kind, keys, wanted, lambda key: key)


def page_of(kind: str, items: Sequence[T], wanted: PageRequest, key: Callable[[T], str]) -> Page[T]:
    """The page of `items` (sorted by `key`, keys distinct) that `wanted` asks for: those after
    the cursor's key, at most `limit` of them. Bisects: a page costs log n plus its size."""
    start = 0
    if wanted.after is not None:
        low, high = 0, len(items)
        while low < high:
            middle = (low + high) // 2
            if key(items[middle]) <= wanted.after:
                low = middle + 1
            else:
                high = middle
        start = low
    if wanted.limit is None:
        return Page(tuple(items[start:]), None)
    chosen = tuple(items[start : start + wanted.limit])
    more = start + wanted.limit < len(items)
    return Page(chosen, encode_cursor(kind, key(chosen[-1])) if more and chosen else None)


def with_link(response: Response, next_cursor: str | None, limit: int | None) -> Response:
    """`response` with a `Link: <...>; rel="next"` header when there is a next page (RFC 8288;
    the same path and query, with the next cursor)."""
    if next_cursor is None:
        return response
    query = [(k, v) for k, v in request.args.items(multi=True) if k not in ("cursor", "limit")]
    query += [("limit", str(limit)), ("cursor", next_cursor)]
    response.headers["Link"] = f'<{request.path}?{urlencode(query)}>; rel="next"'
    return response

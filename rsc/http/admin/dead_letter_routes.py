"""The dead letters of a stream in the Admin API: count, read, replay.

`GET .../dlq` (each shard's dead-letter stream and its length), `GET .../dlq/entries`
(`shard`, `limit`), `POST .../dlq/replay`. Which shards are listed and replayed to is the
registry's (`rsc.actors.stream_dead_letters`).
"""

from __future__ import annotations

import re

from quart import Response, request
from quart_trio import QuartTrio

from rsc.actors.deployment import Deployment
from rsc.events.stream import MAX_SHARDS
from rsc.http import paging
from rsc.http.admin.bodies import (
    DeadLetter,
    DeadLetterEntries,
    DeadLetters,
    DeadLetterShard,
    Replayed,
    ReplayRequest,
    int_query,
    optional_body,
)
from rsc.http.errors import ApiError
from rsc.http.json_io import json_response


def add_dead_letter_routes(app: QuartTrio, deployment: Deployment) -> None:
    """The dead-letter streams of a stream's shards: count, read, replay."""

    @app.get("/v1/admin/streams/<stream_prefix>/dlq")
    async def dead_letters(stream_prefix: str) -> Response:
        counts = await deployment.dead_letter_counts(stream_prefix)
        listed = tuple(DeadLetterShard(c.shard, c.key, c.length) for c in counts)
        return json_response(DeadLetters(stream_prefix, listed, sum(d.length for d in listed)))

    @app.get("/v1/admin/streams/<stream_prefix>/dlq/entries")
    async def dead_letter_entries(stream_prefix: str) -> Response:
        args = request.args
        unknown = sorted(set(args) - {"shard", "limit", "cursor"})
        if unknown:
            raise ApiError(
                400, "INVALID_REQUEST", f"unknown query parameter(s) {unknown}; known: shard, limit, cursor"
            )
        wanted = int_query("shard", None, 0, MAX_SHARDS)
        limit = int_query("limit", 100, 1, 1_000) or 100
        after = _after(args.get("cursor"))
        # One more than asked tells whether a next page exists.
        found = await deployment.dead_letter_entries(stream_prefix, wanted, limit + 1, after)
        page, more = found[:limit], len(found) > limit
        cursor = paging.encode_cursor("dlq", f"{page[-1].shard}/{page[-1].id}") if more and page else None
        entries = tuple(DeadLetter(e.shard, e.id, e.original_id, e.deliveries, e.fields) for e in page)
        return paging.with_link(
            json_response(DeadLetterEntries(stream_prefix, entries, cursor)), cursor, limit
        )

    @app.post("/v1/admin/streams/<stream_prefix>/dlq/replay")
    async def replay(stream_prefix: str) -> Response:
        body = await optional_body(ReplayRequest)
        done = await deployment.replay_dead_letters(stream_prefix, body.shard, body.ids, body.limit)
        return json_response(Replayed(len(done.entries), done.entries, done.skipped_shards))


#: What a dead-letter cursor points after: a shard index and an entry id of its dead letters.
_DLQ_POSITION = re.compile(r"(\d{1,5})/(\d{1,20}-\d{1,20})")


def _after(cursor: str | None) -> tuple[int, str] | None:
    """The (shard, entry id) a dead-letter cursor points after. Raises `ApiError` 400."""
    if cursor is None:
        return None
    found = _DLQ_POSITION.fullmatch(paging.decode_cursor("dlq", cursor))
    if found is None:
        raise ApiError(400, "INVALID_CURSOR", "cursor is not one this server gave for dead letters")
    return int(found.group(1)), found.group(2)

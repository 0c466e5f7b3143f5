"""A group's oldest pending entries as an HTTP answer: the monitoring view (`/pending`, without
payloads) and the Admin API's (with them) share it. Its own module, so that the monitoring
routes and the admin routes can both import it whichever is imported first."""

from __future__ import annotations

from quart import Response, request

from rsc.actors.deployment import Deployment
from rsc.events.errors import UnknownGroup, UnknownStream
from rsc.http import views
from rsc.http.errors import ApiError
from rsc.http.json_io import json_response

__all__ = ["pending_entries"]


async def pending_entries(deployment: Deployment, stream_prefix: str, group: str, payloads: bool) -> Response:
    """`?limit=N` (1-1000, default 20) of the group's oldest pending entries, as `PendingList`."""
    raw = request.args.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 1_000:
        raise ApiError(400, "INVALID_REQUEST", "limit must be an integer from 1 to 1000")
    try:
        found = await deployment.oldest_pending(stream_prefix, group, int(raw), payloads)
    except UnknownStream as exc:
        raise ApiError(404, "UNKNOWN_STREAM", str(exc)) from exc
    except UnknownGroup as exc:
        raise ApiError(404, "UNKNOWN_GROUP", str(exc)) from exc
    return json_response(views.pending_list(stream_prefix, group, found, deployment.now_ms()))

"""A group's members in the Admin API: removing one by hand.

`DELETE .../groups/{g}/members/{id}`: a live member is fenced (`REMOVED`; its shards move once
its lease can have ended), a static member's hold ends (its shards move now). The group
aggregate decides both.
"""

from __future__ import annotations

from quart import Response, g
from quart_trio import QuartTrio

from rsc.actors.deployment import Deployment
from rsc.events.commands import RemoveMember
from rsc.events.errors import AggregateNotFound, UnknownGroup, UnknownStream
from rsc.http.admin.lookup import existing_group
from rsc.http.admin.preconditions import check_if_match
from rsc.http.errors import ApiError


def add_member_routes(app: QuartTrio, deployment: Deployment) -> None:
    """`DELETE` of a group's member (see the module)."""

    @app.delete("/v1/admin/streams/<stream_prefix>/groups/<consumer_group>/members/<path:member_id>")
    async def remove_member(stream_prefix: str, consumer_group: str, member_id: str) -> Response:
        """Remove a member by hand: a live one is fenced (`REMOVED`; its shards move once its
        lease can have ended), a static member's hold ends (its shards move now)."""
        actor = await existing_group(deployment, stream_prefix, consumer_group)
        if actor is None:
            raise ApiError(404, "UNKNOWN_GROUP", f"no group {consumer_group!r} reads {stream_prefix!r}")
        expect = check_if_match(actor.revision)
        command = RemoveMember(member_id, deployment.now_ms())
        try:
            await deployment.ask_group(stream_prefix, consumer_group, command, create=False, expect=expect)
        except (UnknownGroup, UnknownStream):
            raise
        except AggregateNotFound as exc:
            raise ApiError(404, "UNKNOWN_MEMBER", f"{exc} (nor one whose shards are held for it)") from exc
        g.revision = actor.revision  # the group's, after the removal (audited)
        return Response(b"", status=204)

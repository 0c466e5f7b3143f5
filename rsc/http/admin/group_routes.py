"""The group resource of the Admin API: a consumer group's spec.

`PUT` the whole spec, `PATCH` a merge patch, `GET` spec + status (with an `ETag`), `DELETE`.
Which field needs which feature level is `rsc.events.admin_rules`'; that `startFrom` applies
only when a group is created, the group aggregate's (409 `IMMUTABLE_FIELD`).
"""

from __future__ import annotations

from quart import Response, g
from quart_trio import QuartTrio

from rsc.actors.deployment import Deployment
from rsc.events import admin_rules, codec
from rsc.events.commands import ConfigureGroup, PauseGroup, ResumeGroup
from rsc.events.model import GroupConfig
from rsc.events.quotas import Quota
from rsc.http.admin.bodies import (
    EmptyRequest,
    GroupPatch,
    GroupSpec,
    PauseRequest,
    config_of,
    merge_patch,
    merge_patch_body,
    optional_body,
    reset_request,
    spec_of,
    strict,
)
from rsc.http.admin.lookup import conditional_stream, existing_group, group_config, stream_actor, stream_state
from rsc.http.admin.preconditions import (
    check_if_match,
    check_if_none_match,
    missing_with_if_match,
    with_etag,
)
from rsc.http.errors import ApiError
from rsc.http.json_io import json_body, json_response
from rsc.http.pending import pending_entries

GROUP = "/v1/admin/streams/<stream_prefix>/groups/<consumer_group>"


def add_group_routes(app: QuartTrio, deployment: Deployment) -> None:
    """`PUT` (the whole spec), `PATCH` (a merge patch), `GET` and `DELETE` of a group."""
    quota: Quota = app.extensions["rsc.admin_quota"]  # the admin's: the deployment's own

    @app.get(GROUP)
    async def get_group(stream_prefix: str, consumer_group: str) -> Response:
        return await group_resource(deployment, stream_prefix, consumer_group, create=None)

    @app.put(GROUP)
    async def put_group(stream_prefix: str, consumer_group: str) -> Response:
        spec = strict(await json_body(), GroupSpec)
        config = await apply_group(deployment, stream_prefix, consumer_group, spec, quota)
        return await group_resource(deployment, stream_prefix, consumer_group, create=config)

    @app.patch(GROUP)
    async def patch_group(stream_prefix: str, consumer_group: str) -> Response:
        patch = merge_patch_body(await json_body(), GroupPatch)
        actor = await existing_group(deployment, stream_prefix, consumer_group)
        config_now = group_config(actor)
        now = codec.wire.unstructure(spec_of(config_now)) if config_now is not None else {}
        if "startAt" in patch:  # one of two shapes: replaced whole, never merged into the other
            now.pop("startAt", None)
        spec = strict(merge_patch(now, patch), GroupSpec)
        config = await apply_group(deployment, stream_prefix, consumer_group, spec, quota)
        return await group_resource(deployment, stream_prefix, consumer_group, create=config)

    @app.delete(GROUP)
    async def delete_group(stream_prefix: str, consumer_group: str) -> Response:
        stream = await conditional_stream(deployment, stream_prefix)
        if consumer_group not in stream_state(stream).groups:
            missing_with_if_match(f"group {consumer_group!r} of {stream_prefix!r}")
            raise ApiError(404, "UNKNOWN_GROUP", f"no group {consumer_group!r} reads {stream_prefix!r}")
        actor = await existing_group(deployment, stream_prefix, consumer_group)  # never creates
        if actor is None:
            # Deleted, and still listed by the stream: a delete that stopped between its two
            # writes. Finishing it is this DELETE's work (nothing to compare `If-Match` with).
            missing_with_if_match(f"group {consumer_group!r} of {stream_prefix!r}")
            await deployment.delete_group(stream_prefix, consumer_group)
            return Response(b"", status=204)
        expect = check_if_match(actor.revision)
        await deployment.delete_group(stream_prefix, consumer_group, expect)
        g.revision = actor.revision
        return Response(b"", status=204)


def add_group_pause_routes(app: QuartTrio, deployment: Deployment) -> None:
    """An operator's pause and resume of a group (feature level 7): while paused, its members
    keep their membership and heartbeats but hold no shard (each revoked by the ordinary
    protocol), nothing is delivered and lag grows; a resume assigns again. Idempotent; a pause
    keeps its first reason. `If-Match` like every admin write; audited."""

    @app.post(GROUP + "/pause")
    async def pause_group(stream_prefix: str, consumer_group: str) -> Response:
        body = await optional_body(PauseRequest)
        expect = await _existing_revision(deployment, stream_prefix, consumer_group)
        command = PauseGroup(body.reason, deployment.now_ms())
        await deployment.ask_group(stream_prefix, consumer_group, command, create=False, expect=expect)
        return await group_resource(deployment, stream_prefix, consumer_group, create=None)

    @app.post(GROUP + "/resume")
    async def resume_group(stream_prefix: str, consumer_group: str) -> Response:
        await optional_body(EmptyRequest)
        expect = await _existing_revision(deployment, stream_prefix, consumer_group)
        command = ResumeGroup(deployment.now_ms())
        await deployment.ask_group(stream_prefix, consumer_group, command, create=False, expect=expect)
        return await group_resource(deployment, stream_prefix, consumer_group, create=None)


def add_group_reset_routes(app: QuartTrio, deployment: Deployment) -> None:
    """`POST .../groups/{g}/reset`: a reset's plan (`dryRun`, the default), or the reset itself
    (`rsc.actors.group_reset`). Answers the plan; audited; `If-Match` on an execution."""

    @app.get(GROUP + "/pending")
    async def admin_pending(stream_prefix: str, consumer_group: str) -> Response:
        """The group's oldest pending entries with their fields (the admin's view)."""
        return await pending_entries(deployment, stream_prefix, consumer_group, payloads=True)

    @app.post(GROUP + "/reset")
    async def reset(stream_prefix: str, consumer_group: str) -> Response:
        body = reset_request(await json_body())
        expect = await _existing_revision(deployment, stream_prefix, consumer_group)
        if body.dry_run:
            plan = await deployment.plan_reset(stream_prefix, consumer_group, body.to)
        else:
            by = g.caller or "admin"
            plan = await deployment.reset_group(
                stream_prefix, consumer_group, body.to, body.force, by, expect
            )
        return json_response(codec.wire.unstructure(plan))


async def _existing_revision(deployment: Deployment, stream_prefix: str, group: str) -> int | None:
    """The revision `If-Match` must name (None: no `If-Match`). Raises `ApiError` 404 when
    there is no such stream or group (412 with `If-Match`)."""
    await stream_actor(deployment, stream_prefix, None)
    actor = await existing_group(deployment, stream_prefix, group)
    if actor is None:
        missing_with_if_match(f"group {group!r} of {stream_prefix!r}")
        raise ApiError(404, "UNKNOWN_GROUP", f"no group {group!r} reads {stream_prefix!r}")
    return check_if_match(actor.revision)


async def apply_group(
    deployment: Deployment, stream_prefix: str, group: str, spec: GroupSpec, quota: Quota
) -> GroupConfig:
    """Create the group with `spec`, or change it; the config asked for.

    Raises `FeatureLevelRequired` for a spec the finalized feature level does not allow
    (nothing is created), `ApiError` 404 if the stream does not exist, 412 as for streams
    (`If-Match`, `If-None-Match`), `ImmutableField` (409) for a change of `startFrom`,
    `PreconditionFailed`, `QuotaExceeded`, `Deleted` and `StoreError` as the deployment does."""
    config = config_of(spec)
    gate = admin_rules.group_spec_gate(config)
    if gate is not None:  # (the level is read only for a spec that needs one)
        admin_rules.require(gate, await deployment.feature_level())
    actor = await existing_group(deployment, stream_prefix, group)
    only_new = check_if_none_match(actor, f"group {group!r} of {stream_prefix!r}")
    if actor is None:
        missing_with_if_match(f"group {group!r} of {stream_prefix!r}")
        # A group reads a stream that exists: a misspelt stream name is a 404, not a new stream.
        await stream_actor(deployment, stream_prefix, None)
        # A member's join may create the group first (with the default config): then
        # this is a change of the group it made, checked and applied below.
        actor = await deployment.group(stream_prefix, group, config=config, only_new=only_new, quota=quota)
        expect = None
    else:
        expect = check_if_match(actor.revision)
    # Never creates: a group deleted meanwhile is not brought back with the default config.
    configure = ConfigureGroup(config, deployment.now_ms())
    await deployment.ask_group(stream_prefix, group, configure, create=False, expect=expect)
    return config


async def group_resource(
    deployment: Deployment, stream_prefix: str, consumer_group: str, create: GroupConfig | None
) -> Response:
    """The group's spec, status and revision, with its `ETag` (the revision is audited);
    never creates it (a read, or the answer to a write that a `DELETE` may have followed).

    Raises `ApiError` (404) if there is no such stream or (`create` None) group, and
    `UnknownGroup` if the group is gone by the time it is read."""
    stream = await stream_actor(deployment, stream_prefix, None)
    if create is None and consumer_group not in stream_state(stream).groups:
        raise ApiError(404, "UNKNOWN_GROUP", f"no group {consumer_group!r} reads {stream_prefix!r}")
    actor = await deployment.group(stream_prefix, consumer_group, create=False)
    state = actor.state
    assert state is not None  # deployment.group refuses a group that does not exist
    g.revision = actor.revision
    body = {
        "spec": spec_of(state.config),
        "status": {
            "groupEpoch": state.group_epoch,
            "assignmentEpoch": state.assignment_epoch,
            "members": len(state.members),
            "paused": state.paused is not None,
            "pausedReason": None if state.paused is None else state.paused.reason,
            "pausedAtMs": None if state.paused is None else state.paused.since_ms,
        },
        "revision": actor.revision,
    }
    return with_etag(json_response(body), actor.revision)

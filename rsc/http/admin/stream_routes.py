"""The stream resource of the Admin API: its spec, producer pauses, and migrations by hand.

`PUT` the whole spec, `PATCH` a merge patch, `GET` spec + status (with an `ETag`), `DELETE`;
`POST .../pause` and `.../resume` (producers see `paused`, flush, and acknowledge
`quiesced`); `POST .../migration/resume` and `.../migration/abort`. What a spec may ask for
at the deployment's feature level, and when it reshards, is `rsc.events.admin_rules`'.
"""

from __future__ import annotations

from quart import Response, g
from quart_trio import QuartTrio

from rsc.actors.deployment import Deployment
from rsc.events import admin_rules, codec
from rsc.events.commands import PauseProducers, ResumeProducers, SetRetention
from rsc.events.quotas import Quota
from rsc.http.admin.bodies import (
    AbortRequest,
    EmptyRequest,
    PauseRequest,
    StreamPatch,
    StreamSpec,
    merge_patch,
    merge_patch_body,
    optional_body,
    stream_spec,
    strict,
)
from rsc.http.admin.lookup import conditional_stream, existing_stream, stream_actor, stream_state
from rsc.http.admin.preconditions import (
    check_if_match,
    check_if_none_match,
    missing_with_if_match,
    with_etag,
)
from rsc.http.errors import ApiError
from rsc.http.json_io import json_body, json_response
from rsc.http.views import stream_view


def add_stream_routes(app: QuartTrio, deployment: Deployment) -> None:
    """`PUT` (the whole spec), `PATCH` (a merge patch), `GET` and `DELETE` of a stream."""
    quota: Quota = app.extensions["rsc.admin_quota"]  # the admin's: the deployment's own

    @app.get("/v1/admin/streams/<stream_prefix>")
    async def get_stream(stream_prefix: str) -> Response:
        return await stream_resource(deployment, stream_prefix)

    @app.put("/v1/admin/streams/<stream_prefix>")
    async def put_stream(stream_prefix: str) -> Response:
        spec = strict(await json_body(), StreamSpec)
        await apply_stream(deployment, stream_prefix, spec, quota)
        return await stream_resource(deployment, stream_prefix)

    @app.patch("/v1/admin/streams/<stream_prefix>")
    async def patch_stream(stream_prefix: str) -> Response:
        patch = merge_patch_body(await json_body(), StreamPatch)
        if patch.get("shardCount", 0) is None:
            del patch["shardCount"]  # it has no default: null leaves it as it is
        current = await existing_stream(deployment, stream_prefix)
        if current is None and "shardCount" not in patch:
            raise ApiError(
                404,
                "UNKNOWN_STREAM",
                f"no stream {stream_prefix!r}: create it with a shardCount (PUT or PATCH)",
            )
        spec_now = codec.wire.unstructure(stream_spec(stream_state(current))) if current is not None else {}
        if "retention" in patch and patch["retention"] is None:
            patch["retention"] = {}  # null: the default policy (left out would keep the stream's)
            spec_now.pop("retention", None)
        spec = strict(merge_patch(spec_now, patch), StreamSpec)
        await apply_stream(deployment, stream_prefix, spec, quota)
        return await stream_resource(deployment, stream_prefix)

    @app.delete("/v1/admin/streams/<stream_prefix>")
    async def delete_stream(stream_prefix: str) -> Response:
        actor = await conditional_stream(deployment, stream_prefix)
        expect = check_if_match(actor.revision)
        await deployment.delete_stream(stream_prefix, expect)
        g.revision = actor.revision
        return Response(b"", status=204)


def add_pause_routes(app: QuartTrio, deployment: Deployment) -> None:
    """Producer quiescence by hand: producers see `paused`, flush, and acknowledge `quiesced`."""

    @app.post("/v1/admin/streams/<stream_prefix>/pause")
    async def pause(stream_prefix: str) -> Response:
        body = await optional_body(PauseRequest)
        actor = await conditional_stream(deployment, stream_prefix)
        expect = check_if_match(actor.revision)
        command = PauseProducers(body.reason, deployment.now_ms())
        await deployment.ask_stream(stream_prefix, command, expect=expect)
        return await stream_resource(deployment, stream_prefix)

    @app.post("/v1/admin/streams/<stream_prefix>/resume")
    async def resume(stream_prefix: str) -> Response:
        await optional_body(EmptyRequest)
        actor = await conditional_stream(deployment, stream_prefix)
        expect = check_if_match(actor.revision)
        await deployment.ask_stream(stream_prefix, ResumeProducers(deployment.now_ms()), expect=expect)
        return await stream_resource(deployment, stream_prefix)


def add_migration_routes(app: QuartTrio, deployment: Deployment) -> None:
    """Resume a stalled migration, or abort one that has not changed the layout yet."""

    @app.post("/v1/admin/streams/<stream_prefix>/migration/resume")
    async def resume_migration(stream_prefix: str) -> Response:
        await optional_body(EmptyRequest)
        actor = await conditional_stream(deployment, stream_prefix)
        expect = check_if_match(actor.revision)
        await deployment.resume_migration(stream_prefix, expect)
        return await stream_resource(deployment, stream_prefix)

    @app.post("/v1/admin/streams/<stream_prefix>/migration/abort")
    async def abort_migration(stream_prefix: str) -> Response:
        body = await optional_body(AbortRequest)
        actor = await conditional_stream(deployment, stream_prefix)
        expect = check_if_match(actor.revision)
        await deployment.abort_migration(stream_prefix, body.reason, expect)
        return await stream_resource(deployment, stream_prefix)


async def apply_stream(deployment: Deployment, stream_prefix: str, spec: StreamSpec, quota: Quota) -> None:
    """Bring the stream to `spec`: create it, or reshard it and store its mode.

    Raises `FeatureLevelRequired` for a spec the finalized feature level does not allow
    (nothing is created), `QuotaExceeded` above the deployment's quotas (they hold for the
    admin too: 429, audited as refused), `ApiError` 412 for a missing stream with `If-Match`
    (nothing is created) or a failed `If-None-Match`, `PreconditionFailed` if the revision
    `If-Match` names is gone when the change is decided, and what `admin_changes.change_shard_count`
    raises."""
    level = await deployment.feature_level()
    admin_rules.require(admin_rules.reshard_mode_gate(spec.reshard_mode), level)
    admin_rules.require(admin_rules.retention_gate(spec.retention), level)
    with deployment.creating(stream_prefix):  # a missing stream is loaded once, looked at and created
        actor = await existing_stream(deployment, stream_prefix)
        limit = quota.limits.shards_per_stream
        admin_rules.check_shard_quota(spec.shard_count, limit, actor.state if actor is not None else None)
        only_new = check_if_none_match(actor, f"stream {stream_prefix!r}")
        if actor is None:
            missing_with_if_match(f"stream {stream_prefix!r}")
            actor = await stream_actor(deployment, stream_prefix, spec.shard_count, only_new, quota)
            expect = None
        else:
            expect = check_if_match(actor.revision)
    state = stream_state(actor)
    admin_rules.require(admin_rules.scale_in_gate(spec.shard_count, state), level)
    reshard = admin_rules.reshard_for(state, spec.shard_count, spec.reshard_mode, level)
    retention = admin_rules.retention_for(spec.retention, state.retention)
    if retention is not None:
        await deployment.ask_stream(stream_prefix, SetRetention(retention), expect=expect)
        deployment.trim_soon(stream_prefix)  # the new policy (a cap) applies at once
        expect = None  # the change below follows this one, which the precondition let through
    if reshard is not None:
        await deployment.change_shard_count(
            stream_prefix, reshard.shard_count, reshard.mode, reshard.migrations, expect=expect
        )


async def stream_resource(deployment: Deployment, stream_prefix: str) -> Response:
    """The stream's spec, status and revision, with its `ETag` (the revision is audited).

    Raises `ApiError` (404 `UNKNOWN_STREAM`) if there is no such stream."""
    actor = await stream_actor(deployment, stream_prefix, None)
    state = stream_state(actor)
    g.revision = actor.revision
    body = {
        "spec": stream_spec(state),
        "status": stream_view(state, actor.leases, deployment.now_ms()),
        "revision": actor.revision,
    }
    return with_etag(json_response(body), actor.revision)

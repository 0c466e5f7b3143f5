"""What monitoring reads: the views of streams and groups, `/metrics`, `/v1/version`, and the
probes `/healthz` (the process answers) and `/readyz` (Redis answers; the actors' recovery and
what Redis lost).

Views read; none ever creates a stream or a group. Each is authorized by `rsc.http.app`
before it runs, and what a caller sees is its credential's scope (`rsc.events.auth`):
`/v1/streams` lists only the streams it covers, `/metrics` only their series. The views
themselves are built by `rsc.http.views` from aggregate state.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response, request
from quart_trio import QuartTrio

from rsc.actors.deployment import DATA_LOSS, Deployment, StreamActor
from rsc.actors.errors import StoreError
from rsc.events import auth, codec
from rsc.events.auth import Action
from rsc.events.errors import UnknownGroup, UnknownStream
from rsc.events.stream import StreamState
from rsc.http import paging, views
from rsc.http.admin.lookup import stream_state
from rsc.http.authenticate import Gate, Refused
from rsc.http.errors import ApiError
from rsc.http.json_io import beside_loop, error_response, json_response, json_response_beside_loop
from rsc.http.metrics import Metrics, scoped_registry
from rsc.http.pending import pending_entries

#: How long `/readyz` waits for Redis before saying it is not ready.
READY_TIMEOUT_S = 1.0


def add_monitoring_routes(app: QuartTrio, deployment: Deployment, gate: Gate, metrics: Metrics) -> None:
    """The views, `/v1/version`, `/healthz`, `/readyz` and `/metrics` (see the module)."""
    _add_views(app, deployment, gate)
    add_group_reads(app, deployment)
    _add_process_routes(app, deployment, gate, metrics)


def _add_views(app: QuartTrio, deployment: Deployment, gate: Gate) -> None:
    """The views of streams and groups, and a stream's routing."""

    @app.get("/v1/streams/<stream_prefix>/routing")
    async def routing(stream_prefix: str) -> Response:
        state = await existing_stream(stream_prefix)
        return json_response(views.routing_view(state))

    @app.get("/v1/streams")
    async def streams() -> Response:
        wanted = paging.page_request("streams")
        scope = auth.read_scope(gate.policy, gate.principal(), Action.VIEW)
        # A monitor sees the streams its credential covers: pages run over those only.
        visible = [prefix for prefix in await deployment.stream_prefixes() if scope.sees(prefix)]
        page = paging.take_page("streams", visible, wanted)
        states = await deployment.peek_streams(page.items)
        summaries = [views.stream_summary(states[p]) for p in page.items if p in states]
        body: dict[str, Any] = {"streams": summaries}
        if wanted.limit is not None:
            body["nextCursor"] = page.next_cursor
        return paging.with_link(json_response(body), page.next_cursor, wanted.limit)

    @app.get("/v1/streams/<stream_prefix>")
    async def stream(stream_prefix: str) -> Response:
        actor = await existing_stream_actor(stream_prefix)
        state = stream_state(actor)
        facts = await deployment.stream_facts(state)
        now_ms, leases = deployment.now_ms(), actor.leases.snapshot()
        return await json_response_beside_loop(
            lambda: views.stream_view(state, leases, now_ms, facts.stats, facts.evidence, facts.consumed)
        )

    @app.get("/v1/streams/<stream_prefix>/groups/<consumer_group>")
    async def group(stream_prefix: str, consumer_group: str) -> Response:
        wanted = paging.page_request("members")  # a bad query is a 400 before anything is read
        state = await existing_stream(stream_prefix)
        if consumer_group not in state.groups:
            raise ApiError(
                404, "UNKNOWN_GROUP", f"group {consumer_group!r} of {stream_prefix!r} does not exist"
            )
        try:  # a read never creates: a group being deleted is just gone
            actor = await deployment.group(stream_prefix, consumer_group, create=False)
        except UnknownGroup as exc:
            raise ApiError(404, "UNKNOWN_GROUP", str(exc)) from exc
        if actor.state is None:
            raise ApiError(404, "UNKNOWN_GROUP", f"group {consumer_group!r} has no state yet")
        group_state, leases, now_ms = actor.state, actor.leases.snapshot(), deployment.now_ms()
        loss = await deployment.group_loss(state, consumer_group)
        per_shard = {str(i): n for i, n in loss.per_shard.items()}

        def whole() -> views.GroupView:
            view = views.group_view(group_state, leases, now_ms)
            return attrs.evolve(view, trimmed_unseen=loss.total, trimmed_unseen_per_shard=per_shard)

        if wanted.limit is None:
            return await json_response_beside_loop(whole)
        view = whole()
        page = paging.page_of("members", view.members, wanted, lambda m: m.member_id)
        body = codec.wire.unstructure(views.members_page(view, page.items, page.next_cursor))
        body["nextCursor"] = page.next_cursor  # null on the last page, not left out
        return paging.with_link(json_response(body, plain=True), page.next_cursor, wanted.limit)

    async def existing_stream(stream_prefix: str) -> StreamState:
        return stream_state(await existing_stream_actor(stream_prefix))

    async def existing_stream_actor(stream_prefix: str) -> StreamActor:
        try:
            return await deployment.stream(stream_prefix, create=False)
        except UnknownStream as exc:
            raise ApiError(404, "UNKNOWN_STREAM", str(exc)) from exc


def add_group_reads(app: QuartTrio, deployment: Deployment) -> None:
    """A group's oldest pending entries, and what it wants for an autoscaler."""

    @app.get("/v1/streams/<stream_prefix>/groups/<consumer_group>/pending")
    async def pending(stream_prefix: str, consumer_group: str) -> Response:
        """The group's oldest pending entries (ids, member, age, deliveries; never payloads:
        the admin's `GET /v1/admin/.../pending` has them)."""
        return await pending_entries(deployment, stream_prefix, consumer_group, payloads=False)

    @app.get("/v1/streams/<stream_prefix>/groups/<consumer_group>/scale")
    async def scale(stream_prefix: str, consumer_group: str) -> Response:
        """What the group wants, for KEDA's metrics-api scaler (`rsc.events.scaling`):
        `?membersPerReplica=N` (1-1024, default 1: `rsc worker` runs `concurrency` members a
        listener) sets `desiredReplicas`."""
        raw = request.args.get("membersPerReplica", "1")
        if not raw.isdigit() or not 1 <= int(raw) <= 1_024:
            raise ApiError(400, "INVALID_REQUEST", "membersPerReplica must be an integer from 1 to 1024")
        try:
            found = await deployment.group_scale(stream_prefix, consumer_group, int(raw))
        except UnknownStream as exc:
            raise ApiError(404, "UNKNOWN_STREAM", str(exc)) from exc
        except UnknownGroup as exc:
            raise ApiError(404, "UNKNOWN_GROUP", str(exc)) from exc
        return json_response(found)


def _add_process_routes(app: QuartTrio, deployment: Deployment, gate: Gate, metrics: Metrics) -> None:
    """What describes the process: `/v1/version`, the probes, `/metrics`."""

    @app.get("/v1/version")
    async def version() -> Response:
        try:  # read only (a standby answers too; nothing is initialized by a look)
            state = await deployment.peek_feature_state()
        except StoreError:  # Redis away: the rest is still worth answering
            state = None
        if state is None:
            return json_response(views.version_view())
        return json_response(views.version_view(state.level, state.written))

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        with trio.move_on_after(READY_TIMEOUT_S):
            if await deployment.redis_answers():
                try:  # readiness is public: a credential that does not authenticate is nobody here
                    caller = gate.principal()
                except Refused:
                    caller = None
                # Names only for a caller who may see every stream through the views: /readyz
                # is public, so nobody was checked here (read_scope alone assumes a check).
                names = auth.sees_every_stream(gate.policy, caller, Action.VIEW)
                return json_response({"status": "ready", **readiness(deployment, names)})
            return error_response(503, "NOT_READY", "Redis refuses connections or fails", {"redis": "down"})
        return error_response(
            503, "NOT_READY", f"Redis did not answer PING within {READY_TIMEOUT_S} s", {"redis": "timeout"}
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        scope = auth.read_scope(gate.policy, gate.principal(), Action.METRICS)
        source = metrics.prometheus if scope.everything else scoped_registry(metrics.prometheus, scope)
        # Rendered beside the event loop: a deployment of 1,000 shards is 5,000 series, 20-40 ms
        # of one step that every heartbeat answered meanwhile waited for (a scrape every 15 s
        # was a stall in the heartbeats' p99). Each collector reads immutable states and
        # samples, or copies what it reads in one call (`actor_figures`, `sorted(...items())`);
        # the thread yields the interpreter to the loop every switch interval.
        metrics.before_render()
        body = await beside_loop(lambda: generate_latest(source))
        return Response(body, content_type=CONTENT_TYPE_LATEST)


def readiness(deployment: Deployment, names: bool = True) -> dict[str, Any]:
    """`/readyz` details: whether every running actor has recovered (loaded and its side
    effects repaired), and what Redis lost (a correction under way stays ready: the fleet's
    heartbeats carry it). The loss reports name streams and keys: only with `names` (a caller
    that may see every stream), else their kinds and times alone. Raises nothing."""
    running, repairing = deployment.recovery()
    loss = DATA_LOSS.details()
    if not names:
        loss["recent"] = [{k: v for k, v in r.items() if k != "what"} for r in loss["recent"]]
    return {
        "actors": {"running": running, "recovered": running - repairing, "repairing": repairing},
        "dataLoss": loss,
    }

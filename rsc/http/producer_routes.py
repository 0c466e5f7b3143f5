"""Producer heartbeats: `POST /v1/producers/heartbeat`.

A producer's heartbeat is parsed, authorized on its stream, rate limited (a leave never is)
and handed to its stream's actor, which answers with the stream's layout and routing
(`rsc.events.respond.respond_producer`). Shards it reports full (`fullShards`) are handed to
the retention schedule for an early trim (`Registry.trim_requests`). What it may create or
rebuild and the answer's shape are `rsc.events.heartbeat_rules`'.
"""

from __future__ import annotations

import attrs
from quart import Response
from quart_trio import QuartTrio

from rsc.actors.deployment import Deployment
from rsc.events import heartbeat_rules
from rsc.events.auth import Action
from rsc.events.heartbeat_rules import answered_in
from rsc.events.respond import respond_producer
from rsc.events.versions import IDEMPOTENCE_LEVEL
from rsc.events.wire import ProducerHeartbeatRequest
from rsc.http.authenticate import Gate
from rsc.http.callers import QuotaTable, caller_key
from rsc.http.json_io import json_body, json_response, structure
from rsc.http.metrics import Metrics
from rsc.http.ratelimit import HEARTBEATS, PARTY, RateLimits


def add_producer_routes(
    app: QuartTrio,
    deployment: Deployment,
    metrics: Metrics,
    gate: Gate,
    rates: RateLimits,
    quota_of: QuotaTable,
) -> None:
    """`POST /v1/producers/heartbeat` (see the module)."""

    @app.post("/v1/producers/heartbeat")
    async def producer_heartbeat() -> Response:
        with metrics.heartbeat_seconds.labels("producer").time():
            body = structure(await json_body(), ProducerHeartbeatRequest)
            caller = gate.check(Action.PRODUCER_HEARTBEAT, body.stream_prefix)
            timing = deployment.timing
            command = body.to_command(deployment.now_ms(), timing.lease_ttl_ms)
            if heartbeat_rules.producer_limited(body):
                rates.check(HEARTBEATS, caller_key(caller))
                rates.check(PARTY, heartbeat_rules.producer_key(caller, body))
            quota = quota_of(caller)
            # A new producer (no layout yet) reads the level (made on first use: epochs from its
            # first heartbeat); one that routes with a layout may be reporting it to a coordinator
            # whose Redis lost everything: the level is then not made before the stream is
            # rebuilt (at the baseline, for N-1 readers), so the known one is used.
            if body.metadata_version == 0:
                level = await deployment.feature_level()
            else:
                level = deployment.known_feature_level()
            command = attrs.evolve(
                command,
                max_producers=quota.limits.producers_per_stream,
                epochs=level >= IDEMPOTENCE_LEVEL,
            )
            may_create = gate.may_create(caller)
            reply = await deployment.ask_stream(
                body.stream_prefix,
                command,
                create=heartbeat_rules.producer_creates(may_create),
                seen_version=heartbeat_rules.producer_seen_version(body, may_create),
                quota=quota,
            )
            if body.metadata_version > reply.state.layout.metadata_version:
                deployment.behind_the_fleet(body.stream_prefix)  # it routes by a layout Redis lost
            if body.full_shards:  # its appends found these shards full: trim them early
                deployment.trim_soon(body.stream_prefix, body.full_shards)
            response = respond_producer(reply.state, command, timing.heartbeat_interval_ms)
            metrics.producer_answers.labels(body.stream_prefix, response.status.value).inc()
            return json_response(answered_in(response, body.protocol_version, level))

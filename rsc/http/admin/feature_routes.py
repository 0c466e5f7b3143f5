"""The deployment's feature level in the Admin API: `GET` and `PUT /v1/admin/features`.

The status lists every coordinator, live member and live producer with the highest level it
supports. Which levels may be finalized, and whom raising one waits for, is
`rsc.events.admin_rules`'; `rsc.actors.admin_queries` finalizes (`finalize_feature_level`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from quart import Response, g
from quart_trio import QuartTrio

from rsc.actors.deployment import Deployment
from rsc.actors.errors import ActorStopped, FeatureLevelMoved, StoreError
from rsc.events.errors import CoordinationError
from rsc.events.versions import MAX_FEATURE_LEVEL, Party, blockers
from rsc.http.admin.bodies import FeatureChange, FeaturesStatus, strict
from rsc.http.errors import ApiError
from rsc.http.json_io import json_body, json_response

log = logging.getLogger("rsc.admin")


def add_feature_routes(
    app: QuartTrio, deployment: Deployment, coordinators: Callable[[], Awaitable[list[Party]]]
) -> None:
    """`GET`/`PUT /v1/admin/features`; `coordinators` lists the running coordinators."""

    async def parties() -> list[Party]:
        return [*await coordinators(), *await deployment.live_parties()]

    async def status(previous: int | None = None) -> FeaturesStatus:
        state = await deployment.feature_state()
        every = tuple(await parties())
        supported = (1, MAX_FEATURE_LEVEL)
        return FeaturesStatus(
            state.level, state.written, supported, every, blockers(MAX_FEATURE_LEVEL, every), previous
        )

    @app.get("/v1/admin/features")
    async def get_features() -> Response:
        return json_response(await status())

    @app.put("/v1/admin/features")
    async def put_features() -> Response:
        change = strict(await json_body(), FeatureChange)
        try:
            before, final = await deployment.finalize_feature_level(
                change.level, g.caller or "admin", parties
            )
        except FeatureLevelMoved as exc:
            raise ApiError(
                409,
                "FEATURE_LEVEL_IN_USE",
                f"cannot finalize feature level {change.level}: {exc}",
                {"level": exc.level, "written": exc.written},
            ) from exc
        try:
            return json_response(await status(previous=before.level))
        except (StoreError, ActorStopped, CoordinationError) as exc:  # done: say so, even so
            log.warning("feature level %d finalized; listing the parties failed: %s", final.level, exc)
            supported = (1, MAX_FEATURE_LEVEL)
            return json_response(FeaturesStatus(final.level, final.written, supported, (), (), before.level))

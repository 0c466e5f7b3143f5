"""The Admin API: declarative stream and group specs behind Basic Auth, audited.

Resources are idempotent: `PUT` the desired spec, `GET` spec + status with
an `ETag` (the aggregate's journal revision), `If-Match` honoured (412 on a
mismatch). Every request under `/v1/admin/` is audited, whatever happens.

This module only wires the parts together, one job a module: `access` (Basic Auth, the audit
hooks, `GET /v1/admin/audit`), `bodies` (wire types, body and query parsing), `preconditions`
(`ETag`, `If-Match`, `If-None-Match`), `lookup` (the aggregate a request names), and the
resources: `stream_routes`, `group_routes`, `member_routes`, `dead_letter_routes`,
`feature_routes`. The rules they apply are `rsc.events.admin_rules`' and the aggregates'.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from quart_trio import QuartTrio

from rsc.actors.deployment import Deployment, Registry, as_deployment
from rsc.events.versions import Party
from rsc.http.admin.access import add_access_hooks, add_audit_route
from rsc.http.admin.dead_letter_routes import add_dead_letter_routes
from rsc.http.admin.feature_routes import add_feature_routes
from rsc.http.admin.group_routes import add_group_pause_routes, add_group_reset_routes, add_group_routes
from rsc.http.admin.member_routes import add_member_routes
from rsc.http.admin.stream_routes import add_migration_routes, add_pause_routes, add_stream_routes
from rsc.http.audit import AuditLog
from rsc.http.authenticate import AdminAccount

__all__ = ["add_admin_routes"]


def add_admin_routes(
    app: QuartTrio,
    deployment: Deployment | Registry,
    account: AdminAccount,
    audit: AuditLog,
    coordinators: Callable[[], Awaitable[list[Party]]] | None = None,
) -> None:
    """Register `/v1/admin/...` on `app` (made by `create_app`): logins go through the app's
    gate, whose throttle also counts wrong admin credentials sent to other paths.
    `coordinators` lists the running coordinators (for feature level changes). A `Registry`
    for `deployment` is deprecated (`rsc.actors.deployment.as_deployment`)."""
    deployment = as_deployment(deployment)
    add_access_hooks(app, account, audit)
    add_stream_routes(app, deployment)
    add_group_routes(app, deployment)
    add_group_pause_routes(app, deployment)
    add_group_reset_routes(app, deployment)
    add_member_routes(app, deployment)
    add_pause_routes(app, deployment)
    add_migration_routes(app, deployment)
    add_dead_letter_routes(app, deployment)
    add_feature_routes(app, deployment, coordinators or _no_coordinators)
    add_audit_route(app, audit)


async def _no_coordinators() -> list[Party]:
    return []

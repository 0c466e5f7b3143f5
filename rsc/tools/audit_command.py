"""`rsc audit`: the audit records of admin requests, once or followed
(`rsc.tools.admin_terminal` for the connection and the output)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import click

from rsc.client.admin_api import AdminClient
from rsc.tools.admin_terminal import connection_options, utc_time


@click.command()
@click.option("--caller", help="Only this caller.")
@click.option("--method", help="Only this HTTP method.")
@click.option("--status", type=int, help="Only this HTTP status.")
@click.option("--path-prefix", help="Only paths starting with this.")
@click.option("--outcome", type=click.Choice(["ok", "denied", "rejected", "error", "throttled"]))
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=20,
    show_default=True,
    help="How many records (more than 1,000 are read page by page).",
)
@click.option("--follow", is_flag=True, help="Keep printing new records (Ctrl-C to stop).")
@click.option(
    "--interval", type=float, default=1.0, show_default=True, help="Seconds between polls (--follow)."
)
@connection_options
def audit(
    admin: AdminClient,
    output: str,
    caller: str | None,
    method: str | None,
    status: int | None,
    path_prefix: str | None,
    outcome: str | None,
    limit: int,
    follow: bool,
    interval: float,
) -> None:
    """Audit records of admin requests, oldest first."""
    filters = {
        "caller": caller,
        "method": method,
        "status": status,
        "pathPrefix": path_prefix,
        "outcome": outcome,
        "limit": limit,
    }
    seen: set[str] = set()
    first = True
    while True:
        records = list(reversed(admin.audit(**filters)))
        fresh = [r for r in records if _record_key(r) not in seen and not _own_poll(r, follow, path_prefix)]
        seen.update(_record_key(r) for r in fresh)
        for record in fresh:
            click.echo(json.dumps(record, sort_keys=True) if output == "json" else _audit_line(record))
        if first and output == "table" and not fresh:
            click.echo("no audit records match")
        first = False
        if not follow:
            return
        time.sleep(interval)


def _own_poll(record: Mapping[str, Any], follow: bool, path_prefix: str | None) -> bool:
    """`--follow` reads the audit every interval; those reads are not news (unless asked for)."""
    asked = path_prefix is not None and path_prefix.startswith("/v1/admin/audit")
    return follow and not asked and record.get("method") == "GET" and record.get("path") == "/v1/admin/audit"


def _record_key(record: Mapping[str, Any]) -> str:
    return f"{record.get('timeMs')}/{record.get('requestId')}/{record.get('count')}"


def _audit_line(r: Mapping[str, Any]) -> str:
    revision = f" rev {r['revision']}" if r.get("revision") is not None else ""
    caller = r.get("caller") or "anonymous"
    request = f" request {r['requestId']}" if r.get("requestId") else ""
    count = f" ({r['count']} refusals)" if r.get("count") else ""
    return (
        f"{utc_time(r['timeMs'])} {r['outcome']:<9} {r['status']} {r['method']:<6} {r['path']} by {caller} "
        f"from {r['remoteAddress']}{request}{revision}{count}"
    )

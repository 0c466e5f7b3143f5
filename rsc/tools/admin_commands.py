"""`rsc streams|groups|members|producers|audit|dlq ...`: the Admin API from a terminal.

Every command takes `--url` (or `RSC_COORDINATOR_URL`), `--user` and the password from
`RSC_ADMIN_PASSWORD` or a netrc-style file (`rsc.client.admin_api.credentials`), and
`--output table|json`. Mutating commands print what changed, the request id, and the audit
record of that request. Exit codes: 0 done, 1 the coordinator refused or failed (its error
code is printed), 2 a usage error.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import click

from rsc.client.admin_api import AdminClient, AdminError, Answer
from rsc.events.model import MAX_STATIC_HOLD_MS

F = TypeVar("F", bound=Callable[..., Any])
OUTPUTS = click.Choice(["table", "json"])


def connection_options(command: F) -> F:
    """`--url`, `--user`, `--output` for an admin command; passes `admin` and `output`."""

    @click.option("--url", envvar="RSC_COORDINATOR_URL", help="Coordinator URL [env RSC_COORDINATOR_URL].")
    @click.option("--user", envvar="RSC_ADMIN_USER", help="Admin user [env RSC_ADMIN_USER; default admin].")
    @click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)
    @functools.wraps(command)
    def wrapper(url: str | None, user: str | None, output: str, **kwargs: Any) -> Any:
        admin: AdminClient | None = None
        try:
            with AdminClient(url, user) as admin:
                return command(admin=admin, output=output, **kwargs)
        except AdminError as exc:
            where = f" (request {exc.request_id})" if exc.request_id else ""
            hint = ""
            if exc.status == 401 and admin is not None and not admin.sends_credentials:
                hint = "; set RSC_ADMIN_PASSWORD or a netrc entry (RSC_NETRC, ~/.netrc)"
            raise click.ClickException(f"{exc}{hint}{where}") from None

    return wrapper  # type: ignore[return-value]


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns aligned on the widest cell; numbers right-aligned."""
    text = [[_cell(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in text)]) for i, h in enumerate(headers)]
    numeric = [
        all(_is_number(r[i]) for r in text) and any(r[i] != "-" for r in text) for i in range(len(headers))
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in text)])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(v) for v in sorted(value)) or "-"
    return str(value)


def _is_number(cell: str) -> bool:
    return cell == "-" or cell.lstrip("-").replace(".", "", 1).isdigit()


def emit(output: str, data: Any, text: Callable[[], str]) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True) if output == "json" else text())


def done(admin: AdminClient, output: str, answer: Answer, what: str) -> None:
    """What a mutation did, its request id and its audit record."""
    records = admin.audit(requestId=answer.request_id, limit=1)
    record = records[0] if records else None
    if output == "json":
        click.echo(
            json.dumps({"result": answer.body, "requestId": answer.request_id, "audit": record}, indent=2)
        )
        return
    click.echo(what)
    click.echo(f"request {answer.request_id}")
    if record is not None:
        click.echo(
            f"audit: {record['method']} {record['path']} -> {record['status']} {record['outcome']} "
            f"by {record['caller']} at {_when(record['timeMs'])} (revision {record.get('revision')})"
        )


# --- streams -----------------------------------------------------------------


@click.group()
def streams() -> None:
    """Streams: list, describe, create, scale, pause, resume, delete; migrations."""


@streams.command("list")
@connection_options
def streams_list(admin: AdminClient, output: str) -> None:
    """Every stream: layout version, ACTIVE shards, groups."""
    found = admin.streams()
    rows = [(s["streamPrefix"], s["shardCount"], s["metadataVersion"], s["groups"]) for s in found]
    emit(output, found, lambda: table(["STREAM", "SHARDS", "VERSION", "GROUPS"], rows))


@streams.command("describe")
@click.argument("stream")
@connection_options
def streams_describe(admin: AdminClient, output: str, stream: str) -> None:
    """Shards (state, owner per group, pending, lag, length, node), members, migration."""
    view = admin.stream_view(stream)
    spec = admin.stream(stream).body["spec"]
    groups = {g: admin.group_view(stream, g) for g in view["groups"]}
    emit(output, {"spec": spec, "stream": view, "groups": groups}, lambda: describe_text(spec, view, groups))


def describe_text(spec: Mapping[str, Any], view: Mapping[str, Any], groups: Mapping[str, Any]) -> str:
    """The `describe` page: one shard table and one member table per group, then the rest."""
    states = [s["state"] for s in view["shards"]]
    draining = states.count("DRAINING")
    paused = view.get("paused")
    out = [
        f"stream {view['streamPrefix']}: {view['shardCount']} ACTIVE shard(s)"
        + (f", {draining} DRAINING" if draining else "")
        + f", layout v{view['metadataVersion']}, reshardMode {spec['reshardMode']}"
        + (f", paused ({paused['reason']})" if paused else "")
    ]
    readable = [s for s in view["shards"] if s["state"] != "RETIRED"]
    if not groups:
        plain: list[tuple[Any, ...]] = [
            (s["index"], s["state"], s["key"], s.get("length"), s.get("primaryNode")) for s in readable
        ]
        out += ["", table(["SHARD", "STATE", "KEY", "LENGTH", "NODE"], plain)]
    for name, group in groups.items():
        owners = group["currentAssignment"]
        rows: list[tuple[Any, ...]] = []
        for s in readable:
            lag: dict[str, Any] = next((g for g in s.get("groups", ()) if g["group"] == name), {})
            rows.append(
                (
                    s["index"],
                    s["state"],
                    owners.get(str(s["index"])),
                    lag.get("pending"),
                    lag.get("lag"),
                    s.get("length"),
                    s.get("primaryNode"),
                )
            )
        out += [
            "",
            f"group {name}: epoch {group['groupEpoch']}, {len(group['members'])} member(s), "
            f"maxConcurrency {group['config']['maxConcurrency']}",
            table(["SHARD", "STATE", "OWNER", "PENDING", "LAG", "LENGTH", "NODE"], rows),
        ]
        if group["members"]:
            members: list[tuple[Any, ...]] = [
                (
                    m["memberId"],
                    m["memberEpoch"],
                    m["state"],
                    f"{m['leaseLeftMs'] / 1000:.1f}s",
                    m["assigned"],
                )
                for m in group["members"]
            ]
            out += ["", table(["MEMBER", "EPOCH", "STATE", "LEASE LEFT", "SHARDS"], members)]
    m = view.get("migration")
    if m is not None:
        stalled = f"; STALLED: {m['stalled']['reason']}" if m.get("stalled") else ""
        out += [
            "",
            f"migration {m['migrationId']} ({m['mode']}, {m['fromShardCount']} -> "
            f"{m['toShardCount']} shards): {m['phase']}{stalled}",
        ]
        if m.get("waitingForProducers"):
            out.append(f"  waiting for producers: {', '.join(m['waitingForProducers'])}")
        for group, shards in sorted((m.get("waitingForGroups") or {}).items()):
            out.append(f"  waiting for group {group} to consume shard(s) {_cell(shards)}")
    for s in view["shards"]:
        drain = s.get("drain")
        if drain is None:
            continue
        left = [
            f"{g['group']} ({g['pending']} pending{', undelivered' if g['undelivered'] else ''})"
            for g in drain["groups"]
            if g["pending"] or g["undelivered"]
        ]
        why = (
            "drained"
            if drain["drained"]
            else ("waiting for " + ", ".join(left) if left else "waiting for a group to exist")
        )
        if not drain["sealed"]:
            why += ", not sealed yet"
        if drain["waitingForProducers"]:
            why += f", producers not on the layout: {', '.join(drain['waitingForProducers'])}"
        out.append(f"  shard {s['index']} DRAINING: {why}")
    if view.get("producers"):
        rows = [(p["producerId"], p["ackedVersion"], p["upToDate"], p["quiesced"]) for p in view["producers"]]
        out += ["", table(["PRODUCER", "VERSION", "UP TO DATE", "QUIESCED"], rows)]
    return "\n".join(out)


@streams.command("create")
@click.argument("stream")
@click.option("--shards", type=click.IntRange(0, 16_384), required=True, help="Shard count.")
@click.option("--mode", type=click.Choice(["online", "quiesce"]), default="online", show_default=True)
@connection_options
def streams_create(admin: AdminClient, output: str, stream: str, shards: int, mode: str) -> None:
    """Create a stream (refused if it exists: use `scale`)."""
    answer = _said_412(
        lambda: admin.put_stream(stream, {"shardCount": shards, "reshardMode": mode}, create_only=True),
        f"stream {stream!r} exists: `rsc streams scale` changes it",
    )
    done(admin, output, answer, f"stream {stream}: {shards} shard(s), reshardMode {mode}")


@streams.command("scale")
@click.argument("stream")
@click.argument("shards", type=click.IntRange(0, 16_384))
@click.option(
    "--mode", type=click.Choice(["online", "quiesce"]), help="Reshard mode [default: the stored one]."
)
@click.option("--if-match", "if_match", type=int, help="Only if the stream is at this revision.")
@connection_options
def streams_scale(
    admin: AdminClient, output: str, stream: str, shards: int, mode: str | None, if_match: int | None
) -> None:
    """Reshard a stream to SHARDS (online, or quiesce: see docs/operations.md)."""
    patch: dict[str, Any] = {"shardCount": shards}
    if mode is not None:
        patch["reshardMode"] = mode
    # `If-Match: *` at least: a misspelt name is an error, not a new stream.
    answer = _said_412(
        lambda: admin.patch_stream(stream, patch, if_match="*" if if_match is None else if_match),
        f"there is no stream {stream!r} (`rsc streams create` makes one)" if if_match is None else None,
    )
    migration = answer.body["status"].get("migration") or {}
    phase = f", migration {migration['migrationId']} {migration['phase']}" if migration else ""
    done(
        admin, output, answer, f"stream {stream}: target {answer.body['spec']['shardCount']} shard(s){phase}"
    )


@streams.command("pause")
@click.argument("stream")
@click.option("--reason", help="Shown in the stream view.")
@connection_options
def streams_pause(admin: AdminClient, output: str, stream: str, reason: str | None) -> None:
    """Pause the stream's producers."""
    done(admin, output, admin.pause(stream, reason), f"stream {stream}: producers paused")


@streams.command("resume")
@click.argument("stream")
@connection_options
def streams_resume(admin: AdminClient, output: str, stream: str) -> None:
    """Let the stream's producers publish again."""
    done(admin, output, admin.resume(stream), f"stream {stream}: producers resumed")


@streams.command("delete")
@click.argument("stream")
@click.option("--if-match", "if_match", type=int, help="Only if the stream is at this revision.")
@connection_options
def streams_delete(admin: AdminClient, output: str, stream: str, if_match: int | None) -> None:
    """Delete a stream and its shard keys (refused while groups or producers remain)."""
    done(admin, output, admin.delete_stream(stream, if_match), f"stream {stream}: deleted")


@streams.command("migration")
@click.argument("stream")
@click.argument("action", type=click.Choice(["resume", "abort"]))
@click.option("--reason", help="Why (abort).")
@connection_options
def streams_migration(admin: AdminClient, output: str, stream: str, action: str, reason: str | None) -> None:
    """Resume a stalled migration, or abort one that has not changed the layout."""
    answer = admin.migration(stream, action, reason)
    phase = (answer.body["status"].get("migration") or {}).get("phase")
    did = {"resume": "resumed", "abort": "aborted"}[action]
    done(admin, output, answer, f"stream {stream}: migration {did}, phase {phase}")


# --- groups ------------------------------------------------------------------


@click.group()
def groups() -> None:
    """Consumer groups: list, describe, set, delete."""


@groups.command("list")
@click.argument("stream")
@connection_options
def groups_list(admin: AdminClient, output: str, stream: str) -> None:
    """The groups reading a stream."""
    views = [admin.group_view(stream, g) for g in admin.stream_view(stream)["groups"]]
    rows = [
        (
            v["consumerGroup"],
            v["groupEpoch"],
            len(v["members"]),
            v["config"]["maxConcurrency"],
            v["config"]["startFrom"],
        )
        for v in views
    ]
    emit(output, views, lambda: table(["GROUP", "EPOCH", "MEMBERS", "MAX CONCURRENCY", "START FROM"], rows))


@groups.command("describe")
@click.argument("stream")
@click.argument("group")
@connection_options
def groups_describe(admin: AdminClient, output: str, stream: str, group: str) -> None:
    """A group's members and which shard each holds."""
    view = admin.group_view(stream, group)
    owners = {int(s): m for s, m in view["currentAssignment"].items()}
    held = {s: h["memberId"] for h in view.get("holds", ()) if h["static"] for s in h["shards"]}
    readable = [s["index"] for s in admin.stream_view(stream)["shards"] if s["state"] != "RETIRED"]
    # Every shard the group reads, an unowned one with `-` (as `streams describe` shows them), one
    # waiting for a static member that stopped as `(held for <member>)`.
    rows = [
        (i, owners.get(i) or (f"(held for {held[i]})" if i in held else None))
        for i in sorted({*readable, *owners})
    ]

    def text() -> str:
        config = view["config"]
        head = (
            f"group {group} of {stream}: maxConcurrency {config['maxConcurrency']}, startFrom "
            f"{config['startFrom']}, group epoch {view['groupEpoch']}, "
            f"assignment epoch {view['assignmentEpoch']}"
        )
        return "\n".join([head, table(["SHARD", "OWNER"], rows), "", _members_table(view)])

    emit(output, view, text)


def _members_table(view: Mapping[str, Any]) -> str:
    """Live members, then static members that stopped (their shards wait for them: `HELD`)."""
    rows: list[tuple[Any, ...]] = [
        (
            m["memberId"] + (" (static)" if m.get("static") else ""),
            m["memberEpoch"],
            m["state"],
            f"{m['leaseLeftMs'] / 1000:.1f}s",
            m["assigned"],
            m["revoking"],
        )
        for m in view["members"]
    ]
    now_ms = time.time() * 1000
    rows += [
        (
            f"{h['memberId']} (static)",
            "-",
            "HELD",
            f"{max(0.0, (h['untilMs'] - now_ms) / 1000):.1f}s",
            h["shards"],
            [],
        )
        for h in view.get("holds", ())
        if h["static"]
    ]
    return table(["MEMBER", "EPOCH", "STATE", "LEASE LEFT", "ASSIGNED", "REVOKING"], rows)


STATIC_HOLD_HELP = "How long a static member's shards wait for it after it stopped (default: one lease)."
#: `rsc groups set --static-hold-ms -1`: back to the default (one member lease).
DEFAULT_HOLD = -1


@groups.command("create")
@click.argument("stream")
@click.argument("group")
@click.option("--max-concurrency", type=click.IntRange(1, 1_024), default=1, show_default=True)
@click.option(
    "--start-from", type=click.Choice(["earliest", "latest"]), default="earliest", show_default=True
)
@click.option("--static-hold-ms", type=click.IntRange(0, MAX_STATIC_HOLD_MS), help=STATIC_HOLD_HELP)
@connection_options
def groups_create(
    admin: AdminClient,
    output: str,
    stream: str,
    group: str,
    max_concurrency: int,
    start_from: str,
    static_hold_ms: int | None,
) -> None:
    """Create a group of an existing stream (refused if it exists: use `set`)."""
    spec: dict[str, Any] = {"maxConcurrency": max_concurrency, "startFrom": start_from}
    if static_hold_ms is not None:
        spec["staticHoldMs"] = static_hold_ms
    answer = _said_412(
        lambda: admin.put_group(stream, group, spec, create_only=True),
        f"group {group!r} of {stream!r} exists: `rsc groups set` changes it",
    )
    _group_done(admin, output, answer, stream, group)


@groups.command("set")
@click.argument("stream")
@click.argument("group")
@click.option("--max-concurrency", type=click.IntRange(1, 1_024), help="Workers per member.")
@click.option("--start-from", type=click.Choice(["earliest", "latest"]), help="Fixed once created (409).")
@click.option(
    "--static-hold-ms",
    type=click.IntRange(DEFAULT_HOLD, MAX_STATIC_HOLD_MS),
    help=STATIC_HOLD_HELP + " -1: back to the default.",
)
@click.option("--if-match", "if_match", type=int, help="Only if the group is at this revision.")
@connection_options
def groups_set(
    admin: AdminClient,
    output: str,
    stream: str,
    group: str,
    max_concurrency: int | None,
    start_from: str | None,
    static_hold_ms: int | None,
    if_match: int | None,
) -> None:
    """Change the fields given of an existing group (the others stay)."""
    patch: dict[str, Any] = {}
    if max_concurrency is not None:
        patch["maxConcurrency"] = max_concurrency
    if start_from is not None:
        patch["startFrom"] = start_from
    if static_hold_ms is not None:
        patch["staticHoldMs"] = None if static_hold_ms == DEFAULT_HOLD else static_hold_ms
    # `If-Match: *` at least: a misspelt name is an error, not a new group.
    answer = _said_412(
        lambda: admin.patch_group(stream, group, patch, if_match="*" if if_match is None else if_match),
        f"there is no group {group!r} of {stream!r} (`rsc groups create` makes one)"
        if if_match is None
        else None,
    )
    _group_done(admin, output, answer, stream, group)


def _group_done(admin: AdminClient, output: str, answer: Answer, stream: str, group: str) -> None:
    spec = answer.body["spec"]
    what = f"maxConcurrency {spec['maxConcurrency']}, startFrom {spec['startFrom']}"
    if spec.get("staticHoldMs") is not None:
        what += f", staticHoldMs {spec['staticHoldMs']}"
    done(admin, output, answer, f"group {group} of {stream}: {what}")


def _said_412(change: Callable[[], Answer], meaning: str | None) -> Answer:
    """`change()`, with its precondition's 412 said as `meaning` (the create-only or must-exist
    header the command sent); None: the 412 as the server said it (a revision given by hand)."""
    try:
        return change()
    except AdminError as exc:
        if exc.status == 412 and meaning is not None:
            raise click.ClickException(meaning) from exc
        raise


@groups.command("delete")
@click.argument("stream")
@click.argument("group")
@click.option("--if-match", "if_match", type=int, help="Only if the group is at this revision.")
@connection_options
def groups_delete(admin: AdminClient, output: str, stream: str, group: str, if_match: int | None) -> None:
    """Delete a group (refused while it has live members)."""
    done(admin, output, admin.delete_group(stream, group, if_match), f"group {group} of {stream}: deleted")


# --- members, producers --------------------------------------------------------


@click.group()
def members() -> None:
    """Members of a group."""


@members.command("list")
@click.argument("stream")
@click.argument("group")
@connection_options
def members_list(admin: AdminClient, output: str, stream: str, group: str) -> None:
    """Each member: epoch, state, lease left, shards held."""
    view = admin.group_view(stream, group)
    emit(output, view["members"], lambda: _members_table(view))


@members.command("remove")
@click.argument("stream")
@click.argument("group")
@click.argument("member")
@connection_options
def members_remove(admin: AdminClient, output: str, stream: str, group: str, member: str) -> None:
    """Remove MEMBER by hand: a live member is fenced (its shards move once its lease can have
    ended; its process is told FENCED and rejoins), a static member's hold ends at once."""
    done(
        admin,
        output,
        admin.remove_member(stream, group, member),
        f"member {member} of {stream}/{group}: removed",
    )


@click.group()
def producers() -> None:
    """Producers of a stream."""


@producers.command("list")
@click.argument("stream")
@connection_options
def producers_list(admin: AdminClient, output: str, stream: str) -> None:
    """Each producer: the layout version it routes with, quiesced, lease left."""
    found = admin.stream_view(stream)["producers"]
    rows = [
        (p["producerId"], p["ackedVersion"], p["upToDate"], p["quiesced"], f"{p['leaseLeftMs'] / 1000:.1f}s")
        for p in found
    ]
    emit(output, found, lambda: table(["PRODUCER", "VERSION", "UP TO DATE", "QUIESCED", "LEASE LEFT"], rows))


# --- audit -------------------------------------------------------------------


@click.command()
@click.option("--caller", help="Only this caller.")
@click.option("--method", help="Only this HTTP method.")
@click.option("--status", type=int, help="Only this HTTP status.")
@click.option("--path-prefix", help="Only paths starting with this.")
@click.option("--outcome", type=click.Choice(["ok", "denied", "rejected", "error", "throttled"]))
@click.option("--limit", type=click.IntRange(1, 1_000), default=20, show_default=True)
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


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _audit_line(r: Mapping[str, Any]) -> str:
    revision = f" rev {r['revision']}" if r.get("revision") is not None else ""
    caller = r.get("caller") or "anonymous"
    request = f" request {r['requestId']}" if r.get("requestId") else ""
    count = f" ({r['count']} refusals)" if r.get("count") else ""
    return (
        f"{_when(r['timeMs'])} {r['outcome']:<9} {r['status']} {r['method']:<6} {r['path']} by {caller} "
        f"from {r['remoteAddress']}{request}{revision}{count}"
    )


# --- dead letters --------------------------------------------------------------


@click.group()
def dlq() -> None:
    """Dead-letter streams: entries that failed `max_deliveries` times."""


@dlq.command("list")
@click.argument("stream")
@connection_options
def dlq_list(admin: AdminClient, output: str, stream: str) -> None:
    """Per shard: the dead-letter key and how many entries it holds."""
    found = admin.dead_letters(stream)
    states = {s["index"]: s["state"] for s in admin.stream_view(stream)["shards"]}
    rows = [(d["shard"], states.get(d["shard"]), d["key"], d["length"]) for d in found["shards"]]
    emit(output, found, lambda: table(["SHARD", "STATE", "DEAD-LETTER KEY", "ENTRIES"], rows))


@dlq.command("show")
@click.argument("stream")
@click.option("--shard", type=click.IntRange(0), help="Only this shard.")
@click.option("--limit", type=click.IntRange(1, 1_000), default=20, show_default=True)
@connection_options
def dlq_show(admin: AdminClient, output: str, stream: str, shard: int | None, limit: int) -> None:
    """Dead-lettered entries: original id, shard, deliveries, fields."""
    found = admin.dead_letter_entries(stream, shard, limit)
    rows = [
        (e["shard"], e["id"], e["originalId"], e["deliveries"], json.dumps(e["fields"], sort_keys=True))
        for e in found["entries"]
    ]
    emit(output, found, lambda: table(["SHARD", "ID", "ORIGINAL ID", "DELIVERIES", "FIELDS"], rows))


@dlq.command("replay")
@click.argument("stream")
@click.option("--shard", type=click.IntRange(0), help="Only this shard's dead letters.")
@click.option("--id", "ids", multiple=True, help="Only these dead-letter entry ids (repeatable).")
@click.option("--limit", type=click.IntRange(1, 1_000), default=100, show_default=True)
@connection_options
def dlq_replay(
    admin: AdminClient, output: str, stream: str, shard: int | None, ids: tuple[str, ...], limit: int
) -> None:
    """Append dead-lettered entries to the stream again (routed by their key), then remove them."""
    answer = admin.replay_dead_letters(stream, shard, list(ids), limit)
    done(admin, output, answer, f"stream {stream}: {answer.body['replayed']} dead letter(s) replayed")


COMMANDS = (streams, groups, members, producers, audit, dlq)

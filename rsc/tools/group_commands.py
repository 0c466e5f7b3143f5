"""`rsc groups ...` and `rsc members ...`: consumer groups of a stream and their members, through
the Admin API (`rsc.tools.admin_terminal` for the connection and the output)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import click

from rsc.client.admin_api import AdminClient, Answer
from rsc.events.model import MAX_STATIC_HOLD_MS
from rsc.tools.admin_terminal import connection_options, done, emit, iso_ms, said_412, table


@click.group()
def groups() -> None:
    """Consumer groups: list, describe, set, delete, pause, resume, reset."""


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
        if view.get("paused"):
            head += f"\nPAUSED: {view.get('pausedReason')}"
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
    answer = said_412(
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
    answer = said_412(
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


@groups.command("delete")
@click.argument("stream")
@click.argument("group")
@click.option("--if-match", "if_match", type=int, help="Only if the group is at this revision.")
@connection_options
def groups_delete(admin: AdminClient, output: str, stream: str, group: str, if_match: int | None) -> None:
    """Delete a group (refused while it has live members)."""
    done(admin, output, admin.delete_group(stream, group, if_match), f"group {group} of {stream}: deleted")


@groups.command("pause")
@click.argument("stream")
@click.argument("group")
@click.option("--reason", help="Shown in the group view.")
@connection_options
def groups_pause(admin: AdminClient, output: str, stream: str, group: str, reason: str | None) -> None:
    """Pause a group: its members keep heartbeating but hand every shard back; nothing is
    delivered (lag grows) until `rsc groups resume` (feature level 7)."""
    done(admin, output, admin.pause_group(stream, group, reason), f"group {group} of {stream}: paused")


@groups.command("resume")
@click.argument("stream")
@click.argument("group")
@connection_options
def groups_resume(admin: AdminClient, output: str, stream: str, group: str) -> None:
    """Resume a paused group: it is assigned again."""
    done(admin, output, admin.resume_group(stream, group), f"group {group} of {stream}: resumed")


@groups.command("reset")
@click.argument("stream")
@click.argument("group")
@click.option("--to-earliest", "earliest", is_flag=True, help="Everything the shard keys still hold, again.")
@click.option("--to-latest", "latest", is_flag=True, help="Skip everything published so far.")
@click.option("--to-time", "at", help="An ISO-8601 time: entries at or after it are delivered (again).")
@click.option(
    "--to-ids",
    "ids_file",
    type=click.File(),
    help='A JSON file of shard index -> id, e.g. a plan\'s "ids" (rsc groups reset ... -o json).',
)
@click.option("--execute", is_flag=True, help="Reset (without it: print the plan, change nothing).")
@click.option("--force", is_flag=True, help="Reset a group that has members: it is paused meanwhile.")
@connection_options
def groups_reset(
    admin: AdminClient,
    output: str,
    stream: str,
    group: str,
    earliest: bool,
    latest: bool,
    at: str | None,
    ids_file: Any,
    execute: bool,
    force: bool,
) -> None:
    """Reset GROUP's position on every ACTIVE shard of STREAM: prints the plan (what each shard
    delivers again or skips); `--execute` resets (refused while the group has members unless
    `--force`). Never prompts."""
    chosen = [bool(earliest), bool(latest), at is not None, ids_file is not None]
    if sum(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-time, --to-ids")
    to: Any = "earliest" if earliest else "latest" if latest else None
    if at is not None:
        to = {"timeMs": iso_ms(at, "--to-time")}
    elif ids_file is not None:
        loaded = json.load(ids_file)
        to = {"ids": loaded.get("ids", loaded) if isinstance(loaded, dict) else loaded}
    answer = admin.reset_group(stream, group, to, execute=execute, force=force)
    plan = answer.body

    def text() -> str:
        rows = [
            (
                s["shard"],
                s["state"],
                s.get("current") or "-",
                s.get("new") or "-",
                _counted(s, "redelivered"),
                _counted(s, "skipped"),
                s.get("pending", 0),
                s.get("why") or "",
            )
            for s in plan["shards"]
        ]
        head = f"group {group} of {stream}: reset " + (
            "done" if plan["executed"] else "planned (nothing changed: --execute resets)"
        )
        columns = ["SHARD", "STATE", "CURRENT", "NEW", "AGAIN", "SKIPPED", "PENDING", "NOTE"]
        return "\n".join([head, table(columns, rows)])

    emit(output, plan, text)


def _counted(shard: Mapping[str, Any], field: str) -> str:
    n = shard.get(field, 0)
    return f"{n}" if shard.get("exact", True) else f">={n}"


# --- members -------------------------------------------------------------------


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

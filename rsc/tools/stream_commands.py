"""`rsc streams ...` and `rsc producers ...`: a stream, its layout and migrations, its producers,
through the Admin API (`rsc.tools.admin_terminal` for the connection and the output)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from rsc.client.admin_api import AdminClient
from rsc.tools.admin_terminal import cell, connection_options, done, emit, said_412, table


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
    """The `describe` page: one shard table and one member table per group, then the rest.

    Raises KeyError if a view lacks a field the Admin API always sends.
    """
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
            out.append(f"  waiting for group {group} to consume shard(s) {cell(shards)}")
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
    answer = said_412(
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
    answer = said_412(
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


# --- producers -----------------------------------------------------------------


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
